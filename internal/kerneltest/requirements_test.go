package kerneltest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestKernelRequirements: a kernel either has everything the datapath's
// programs use (the other tests then load and run it), or it is refused by
// name before anything is made: by datapath.Open and by `socklane attach`,
// which exits non-zero naming each missing feature and the first release
// that has them all, with nothing pinned and nothing attached. The matrix
// boots a kernel of each kind (scripts/kernel-matrix.sh: 5.10 is refused).
func TestKernelRequirements(t *testing.T) {
	testutil.RequireRoot(t)
	err := datapath.CheckKernel()
	if err == nil {
		t.Logf("SLKR meets %s", kernel())
		return
	}
	var mf *datapath.MissingFeaturesError
	if !errors.As(err, &mf) {
		t.Fatalf("probing the kernel: %v", err)
	}
	t.Logf("SLKR refused %s", err)
	if len(mf.Missing) == 0 || mf.FirstKernel() == "" {
		t.Errorf("refusal names %d features, first kernel %q", len(mf.Missing), mf.FirstKernel())
	}
	if err := bpffs.Ensure(bpffs.DefaultPath); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("sl-ktest-refuse-%d", os.Getpid())
	pin := filepath.Join(bpffs.DefaultPath, name)
	if _, err := datapath.Open(datapath.Config{PinDir: pin}); !errors.As(err, &mf) {
		t.Errorf("datapath.Open: %v, want the kernel refused by name", err)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("datapath.Open left %s behind (%v)", pin, err)
	}

	root, err := cgroups.Root()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	out, err := exec.Command(testutil.Binary(t), "--name", name, "attach", "--cgroup", cg).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("socklane attach on a kernel it cannot run on: %v, want a non-zero exit\n%s", err, out)
	}
	for _, want := range []string{"lacks what socklane's datapath needs", mf.Missing[0].What, "Linux " + mf.FirstKernel() + " or later"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("socklane attach says %q, want it to say %q", out, want)
		}
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socklane attach left %s behind (%v)", pin, err)
	}
	fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupSockOps, ebpf.AttachCGroupInet4Connect} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: at})
		if err != nil {
			t.Fatalf("querying %s on %s: %v", at, cg, err)
		}
		if len(res.Programs) != 0 {
			t.Errorf("%d programs attached to %s (%s) after a refusal", len(res.Programs), cg, at)
		}
	}
}
