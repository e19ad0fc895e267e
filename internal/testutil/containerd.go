package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/socklane/socklane/internal/cri"
)

// Image references the test runtime knows: both carry the socklane
// binary; the pause image's entrypoint sleeps.
const (
	PauseImage = "socklane.test/pause:1"
	PeerImage  = "socklane.test/socklane:1"
	criBridge  = "slcni0"
	criSubnet  = "198.18.200.0/24"
	// CgroupParent is where the test pods' cgroups go (cgroupfs driver).
	criCgroupParent = "/socklane-cri"
)

// Runtime is a containerd started for one test, with its own root,
// socket, CNI bridge network (198.18.200.0/24) and images.
type Runtime struct {
	t      testing.TB
	Dir    string
	Socket string
	Client *cri.Client
}

// StartContainerd starts containerd with the CRI plugin (cgroupfs driver,
// the bridge CNI plugin) and imports the test images.
func StartContainerd(t testing.TB) *Runtime {
	t.Helper()
	RequireRoot(t)
	for _, c := range []string{"containerd", "runc", "ctr", "containerd-shim-runc-v2"} {
		RequireCommand(t, c)
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if InCI() {
			t.Fatal("CNI plugins missing (/usr/lib/cni/bridge): install containernetworking-plugins")
		}
		t.Skip("CNI plugins missing (/usr/lib/cni/bridge): install containernetworking-plugins")
	}
	dir, err := os.MkdirTemp("", "socklane-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runtime{t: t, Dir: dir, Socket: filepath.Join(dir, "containerd.sock")}
	for _, d := range []string{"cni", "logs", "ipam"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cniConf := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "socklane-test", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}`, criBridge, filepath.Join(dir, "ipam"), criSubnet)
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-socklane-test.conflist"), []byte(cniConf), 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  systemd_cgroup = false
  # Without CAP_SYS_RESOURCE (a sandboxed root) runc cannot lower
  # oom_score_adj below its own: keep it at the runtime's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), r.Socket, PauseImage, filepath.Join(dir, "cni"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.stop(cmd, logf) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(r.Socket); err == nil {
			if c, err := cri.Dial(context.Background(), r.Socket); err == nil {
				r.Client = c
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not come up: %s", tail(string(log), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	bin := Binary(t)
	for _, img := range []struct {
		ref        string
		entrypoint []string
	}{
		{PauseImage, []string{"/socklane", "peer", "pause"}},
		{PeerImage, []string{"/socklane"}},
	} {
		tarPath := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.ref)+".tar")
		if err := OCIImage(tarPath, img.ref, bin, "socklane", img.entrypoint); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("ctr", "--address", r.Socket, "-n", "k8s.io", "images", "import", tarPath).CombinedOutput(); err != nil {
			t.Fatalf("importing %s: %v: %s", img.ref, err, out)
		}
	}
	return r
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop removes every pod, stops containerd and its shims, and removes
// what they left: mounts, the CNI bridge, cgroups, the directory.
func (r *Runtime) stop(cmd *exec.Cmd, logf *os.File) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.Client != nil {
		if sbs, err := r.Client.Runtime().ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, sb := range sbs.Items {
				_, _ = r.Client.Runtime().StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id})
				_, _ = r.Client.Runtime().RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id})
			}
		}
		r.Client.Close()
	}
	stopProcess(cmd, 10*time.Second)
	logf.Close()
	// Shims of this containerd (they outlive it by design).
	_ = exec.Command("pkill", "-KILL", "-f", "containerd-shim-runc-v2 .*-address "+r.Socket).Run()
	if mounts, err := os.ReadFile("/proc/self/mounts"); err == nil {
		var ours []string
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], r.Dir) {
				ours = append(ours, f[1])
			}
		}
		for i := len(ours) - 1; i >= 0; i-- {
			_ = syscall.Unmount(ours[i], syscall.MNT_DETACH)
		}
	}
	_ = exec.Command("ip", "link", "del", criBridge).Run()
	// runc made the pods' cgroups in every hierarchy (v1 controllers too).
	for _, mp := range cgroupMounts() {
		_ = removeTree(filepath.Join(mp, criCgroupParent))
	}
	if err := os.RemoveAll(r.Dir); err != nil {
		r.t.Errorf("removing %s: %v", r.Dir, err)
	}
}

// cgroupMounts lists the mount points of cgroup v1 and v2 hierarchies.
func cgroupMounts() []string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out
}

// removeTree removes a cgroup directory tree bottom-up.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			_ = removeTree(filepath.Join(dir, e.Name()))
		}
	}
	return syscall.Rmdir(dir)
}

// ContainerSpec is a container of a test pod: a name and the socklane
// command line it runs.
type ContainerSpec struct {
	Name string
	Args []string
}

// RunPod creates a pod namespace/name with labels and starts its
// containers, setting the labels the kubelet would. It returns the
// sandbox id.
func (r *Runtime) RunPod(namespace, name string, labels map[string]string, containers ...ContainerSpec) string {
	r.t.Helper()
	var u [8]byte
	_, _ = rand.Read(u[:])
	return r.RunPodUID(namespace, name, hex.EncodeToString(u[:]), labels, containers...)
}

// RunPodUID is RunPod for a pod of a given UID (as the kubelet runs the
// API server's pods).
func (r *Runtime) RunPodUID(namespace, name, uid string, labels map[string]string, containers ...ContainerSpec) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all := map[string]string{
		"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": uid,
	}
	for k, v := range labels {
		all[k] = v
	}
	logDir := filepath.Join(r.Dir, "logs", uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		Hostname:     name,
		LogDirectory: logDir,
		Labels:       all,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: criCgroupParent + "/pod" + uid,
		},
	}
	rt := r.Client.Runtime()
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(r.Dir, "containerd.log"))
		r.t.Fatalf("running pod %s/%s: %v\n%s", namespace, name, err, tail(string(log), 3000))
	}
	for _, c := range containers {
		cc, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId: sb.PodSandboxId,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: c.Name},
				Image:    &runtimeapi.ImageSpec{Image: PeerImage},
				Args:     c.Args,
				Labels: map[string]string{
					"io.kubernetes.container.name": c.Name, "io.kubernetes.pod.name": name,
					"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": uid,
				},
				LogPath: c.Name + ".log",
			},
			SandboxConfig: sbCfg,
		})
		if err != nil {
			r.t.Fatalf("creating container %s in %s/%s: %v", c.Name, namespace, name, err)
		}
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
			r.t.Fatalf("starting container %s in %s/%s: %v", c.Name, namespace, name, err)
		}
	}
	return sb.PodSandboxId
}

// RemovePod stops and removes a pod, and removes its cgroup as the
// kubelet would.
func (r *Runtime) RemovePod(id string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var uid string
	if st, err := r.Client.Runtime().PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id}); err == nil && st.Status != nil && st.Status.Metadata != nil {
		uid = st.Status.Metadata.Uid
	}
	defer func() {
		if uid == "" {
			return
		}
		for _, mp := range cgroupMounts() {
			_ = removeTree(filepath.Join(mp, criCgroupParent, "pod"+uid))
		}
	}()
	if _, err := r.Client.Runtime().StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		r.t.Fatalf("stopping pod %s: %v", id, err)
	}
	if _, err := r.Client.Runtime().RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		r.t.Fatalf("removing pod %s: %v", id, err)
	}
}

// Exec runs a command in a container and returns its output.
func (r *Runtime) Exec(containerID string, timeout time.Duration, cmd ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	resp, err := r.Client.Runtime().ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: cmd, Timeout: int64(timeout.Seconds())})
	if err != nil {
		return "", err
	}
	out := string(resp.Stdout) + string(resp.Stderr)
	if resp.ExitCode != 0 {
		return out, fmt.Errorf("exit code %d", resp.ExitCode)
	}
	return out, nil
}
