package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/socklane/socklane/internal/statesync"
)

// The state sync's families (only when the agent syncs maps).
var (
	famSyncUpdates   = family{"sync_updates_total", "Map changes of the state sync, by what happened: published (written on this node and numbered), sent (to a peer, counted per peer), applied (a peer's change that won and was written to the map), stale (a peer's change older than what the map holds), resent (a peer's change received again after a reconnect, skipped), dropped (received while a resync was awaited).", prometheus.CounterValue, []string{"event"}}
	famSyncSnapshots = family{"sync_snapshots_total", "Snapshots of the whole synced state, by direction (sent, applied).", prometheus.CounterValue, []string{"direction"}}
	famSyncResyncs   = family{"sync_resyncs_total", "Resyncs: a gap in a peer's changes, a peer that fell behind the resend log, a diverged digest, or a peer's request.", prometheus.CounterValue, nil}
	famSyncRefused   = family{"sync_refused_total", "Peers refused: an untrusted certificate, a name not listed, another protocol, or tables that differ.", prometheus.CounterValue, nil}
	famSyncDiverged  = family{"sync_diverged_total", "Digests that found this node's copy of a peer's entries different twice in a row.", prometheus.CounterValue, nil}
	famSyncLost      = family{"sync_lost_records_total", "Change records the writing programs could not put in the ring buffer (each loss makes the agent read the whole map).", prometheus.CounterValue, nil}
	famSyncPolls     = family{"sync_map_reads_total", "Whole-map reads (polls of maps without change records, and reads after lost records).", prometheus.CounterValue, nil}
	famSyncPeerUp    = family{"sync_peer_up", "1 while the stream with a listed peer is open.", prometheus.GaugeValue, []string{"peer"}}
	famSyncLag       = family{"sync_peer_lag_seconds", "Age of a peer's last change when this node applied it (0 once caught up).", prometheus.GaugeValue, []string{"peer"}}
	famSyncBehind    = family{"sync_peer_behind", "A peer's changes it has sent that this node has not applied yet.", prometheus.GaugeValue, []string{"peer"}}
	famSyncEntries   = family{"sync_entries", "Live entries of a synced table.", prometheus.GaugeValue, []string{"table"}}
	famSyncActive    = family{"sync_active", "1 while this node is the active one of the active-standby tables.", prometheus.GaugeValue, nil}
)

var syncFamilies = []family{
	famSyncUpdates, famSyncSnapshots, famSyncResyncs, famSyncRefused, famSyncDiverged, famSyncLost,
	famSyncPolls, famSyncPeerUp, famSyncLag, famSyncBehind, famSyncEntries, famSyncActive,
}

// SyncCollector exports the state sync's status. Its labels are the
// operator's lists of peers and tables.
type SyncCollector struct {
	status func() statesync.Status
	descs  map[string]*prometheus.Desc
}

// NewSync collects from status (statesync.Engine.Status).
func NewSync(status func() statesync.Status) *SyncCollector {
	c := &SyncCollector{status: status, descs: map[string]*prometheus.Desc{}}
	for _, f := range syncFamilies {
		c.descs[f.name] = prometheus.NewDesc(f.fqName(), f.help, f.labels, nil)
	}
	return c
}

// Describe sends every family's descriptor.
func (c *SyncCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect reads the status once.
func (c *SyncCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	emit := func(f family, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[f.name], f.typ, v, labels...)
	}
	n := st.Counters
	for _, u := range []struct {
		event string
		v     uint64
	}{{"published", n.Published}, {"sent", n.Sent}, {"applied", n.Applied}, {"stale", n.Stale}, {"resent", n.Resent}, {"dropped", n.Dropped}} {
		emit(famSyncUpdates, float64(u.v), u.event)
	}
	emit(famSyncSnapshots, float64(n.SnapshotsSent), "sent")
	emit(famSyncSnapshots, float64(n.SnapshotsApplied), "applied")
	emit(famSyncResyncs, float64(n.Resyncs))
	emit(famSyncRefused, float64(n.Refused))
	emit(famSyncDiverged, float64(n.Diverged))
	emit(famSyncLost, float64(n.LostRecords))
	emit(famSyncPolls, float64(n.Polls))
	for _, p := range st.Peers {
		up := 0.0
		if p.Connected {
			up = 1
		}
		emit(famSyncPeerUp, up, p.Name)
		emit(famSyncLag, p.LagSeconds, p.Name)
		emit(famSyncBehind, float64(p.Behind), p.Name)
	}
	for _, t := range st.Tables {
		emit(famSyncEntries, float64(t.Entries), t.Name)
	}
	active := 0.0
	if st.Active {
		active = 1
	}
	emit(famSyncActive, active)
}
