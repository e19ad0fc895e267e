// Command socklane is the node agent and CLI of the socklane socket-layer
// data plane.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/socklane/socklane/internal/datapath"
)

// exitError carries a specific exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	// The one context: SIGINT and SIGTERM end every command through it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "socklane:", withFix(err))
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

// withFix adds to a lower layer's error what the user can do about it.
func withFix(err error) error {
	if errors.Is(err, datapath.ErrIncompatible) {
		return fmt.Errorf("%w; run `socklane down` (it detaches, lets bypassed connections drain, then unpins) and start this socklane again", err)
	}
	return err
}
