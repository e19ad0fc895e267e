package datapath

import "path/filepath"

// The pod table (sl_pod_records): what each node says of its own pods to
// the other nodes' network policies, replicated by the state sync. Only
// the agent reads and writes it; no program looks it up.
type (
	// PodKey is a pod address, IPv6 or IPv4-mapped.
	PodKey = servicelbSlPodKey
	// PodRecord is an encoded socklane.sync.v1.PodRecord and its length.
	PodRecord = servicelbSlPodRecord
)

const (
	// PodTableName is the pod table's pinned name, also its name in the
	// state sync.
	PodTableName = servicelbMapSlPodRecords
	// PodRecordData is the most an encoded record may take.
	PodRecordData = int(servicelbSlPodLimitsSL_POD_RECORD_DATA)
	// MaxPodRecords is how many pod addresses the table holds.
	MaxPodRecords = int(servicelbSlPodLimitsSL_POD_MAX_RECORDS)
)

// PodTablePin is where the datapath pinned in pinDir keeps the pod table.
func PodTablePin(pinDir string) string { return filepath.Join(pinDir, PodTableName) }
