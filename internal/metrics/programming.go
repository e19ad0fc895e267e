package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// programmingHelp describes socklane_service_programming_seconds.
const programmingHelp = "Service programming latency: from the first Kubernetes API event of a batch (Service, EndpointSlice or this Node changed) to the datapath's maps holding it, stale sockets destroyed."

// programmingBuckets span 1 ms to about 16 s.
var programmingBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// Programming is the histogram of service programming latency, observed
// by the agent's Kubernetes source after each apply.
type Programming struct {
	h prometheus.Histogram
}

// NewProgramming makes the histogram.
func NewProgramming() *Programming {
	return &Programming{h: prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "service_programming_seconds", Help: programmingHelp, Buckets: programmingBuckets,
	})}
}

// Observe records one apply's latency.
func (p *Programming) Observe(d time.Duration) { p.h.Observe(d.Seconds()) }

// Describe sends the histogram's descriptor.
func (p *Programming) Describe(ch chan<- *prometheus.Desc) { p.h.Describe(ch) }

// Collect sends the histogram.
func (p *Programming) Collect(ch chan<- prometheus.Metric) { p.h.Collect(ch) }
