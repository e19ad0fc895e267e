package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// newApplyCmd is the `apply -f FILE` of svc, policy and ports: the whole
// file is parsed and validated before the running datapath is opened, so a
// bad file changes nothing; apply then makes the node hold exactly what it
// describes. what names the file in the flag's help and in the error.
func newApplyCmd[T any](g *globals, what, short string, parse func(path string) (T, error),
	apply func(cmd *cobra.Command, dp *datapath.Datapath, set T) error) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "apply -f FILE",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("give the %s file with -f FILE", what)
			}
			set, err := parse(file)
			if err != nil {
				return err
			}
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			return apply(cmd, dp, set)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "YAML "+what+" file")
	return c
}

// globals are the flags every command shares.
type globals struct {
	bpffs   string
	name    string
	output  string
	verbose bool
}

func (g *globals) pinDir() string { return filepath.Join(g.bpffs, g.name) }

func (g *globals) logger(w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if g.verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// openPinned opens the running datapath for reading or changing; it never
// creates one.
func (g *globals) openPinned() (*datapath.Datapath, error) {
	dp, err := node.OpenRunning(g.bpffs, g.name)
	if errors.Is(err, datapath.ErrNotPinned) {
		return nil, fmt.Errorf("socklane is not running on this node (nothing pinned at %s): start it with `socklane agent` or `socklane attach`", g.pinDir())
	}
	return dp, err
}

func (g *globals) json() bool { return g.output == "json" }

// withTimeout is ctx (main's, which SIGINT and SIGTERM end), ending after
// d too when d > 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "socklane",
		Short:         "eBPF socket-layer data plane: same-node TCP bypass for Kubernetes nodes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if g.output != "text" && g.output != "json" {
				return fmt.Errorf("unknown output format %q: use -o text or -o json", g.output)
			}
			return datapath.CheckInstanceName(g.name)
		},
	}
	root.PersistentFlags().StringVar(&g.bpffs, "bpffs", bpffs.DefaultPath, "bpf filesystem holding the pinned datapath")
	root.PersistentFlags().StringVar(&g.name, "name", "socklane", "name of this datapath instance (directory under --bpffs)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "text", "output format: text or json")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "debug logging")
	root.AddCommand(
		newAgentCmd(g),
		newStatusCmd(g),
		newAttachCmd(g),
		newDetachCmd(g),
		newConnsCmd(g),
		newEventsCmd(g),
		newCaptureCmd(g),
		newTopCmd(g),
		newPodsCmd(g),
		newSvcCmd(g),
		newBypassCmd(g),
		newPolicyCmd(g),
		newPortsCmd(g),
		newSyncCmd(g),
		newDownCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newPeerCmd(),
	)
	return root
}
