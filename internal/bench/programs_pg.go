package bench

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pgHBA lets any client of the pods' addresses in as any user: the
// server listens only in the bench's server pod.
const pgHBA = `local all all trust
host all all 0.0.0.0/0 trust
host all all ::/0 trust
`

// pgUser is who postgres runs as (it refuses root): the user Debian's
// package creates.
const pgUser = "postgres"

// pgCredential is pgUser's, for the commands bench runs as it.
func pgCredential() (*syscall.Credential, error) {
	u, err := user.Lookup(pgUser)
	if err != nil {
		return nil, fmt.Errorf("postgres runs as user %s: %w (apt-get install postgresql creates it)", pgUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// asPostgres runs a postgres command on the host as pgUser (initdb,
// pgbench -i over the server's Unix socket).
func asPostgres(cred *syscall.Credential, name string, args ...string) error {
	path, err := lookProgram(name)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Env = append(os.Environ(), "PGUSER="+pgUser)
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}

// startPostgres creates a database cluster owned by pgUser, starts its
// server in the server pod (listening on every address, fsync off: the
// bench measures round trips, not the disk) and fills pgbench's tables
// at scale 1 once it answers on its Unix socket.
func startPostgres(r *runner, cpu, port int) error {
	cred, err := pgCredential()
	if err != nil {
		return err
	}
	if err := os.Chmod(r.dir, 0o711); err != nil {
		return err
	}
	dir := filepath.Join(r.dir, fmt.Sprintf("pg-%d", port))
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return err
	}
	if err := asPostgres(cred, "initdb", "--pgdata", data, "--username", pgUser, "--auth", "trust", "--no-sync",
		"--encoding", "UTF8", "--locale", "C"); err != nil {
		return err
	}
	hba := filepath.Join(data, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte(pgHBA), 0o600); err != nil {
		return err
	}
	if err := os.Chown(hba, int(cred.Uid), int(cred.Gid)); err != nil {
		return err
	}
	server, err := lookProgram("postgres")
	if err != nil {
		return err
	}
	if err := r.startPinned(cpu, Postgres, "setpriv", "--reuid", pgUser, "--regid", pgUser, "--init-groups", "--",
		server, "-D", data, "-k", dir, "-p", strconv.Itoa(port), "-c", "listen_addresses=*",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=20"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := asPostgres(cred, "pgbench", "--initialize", "--scale", "1", "--quiet", "--host", dir, "--port", strconv.Itoa(port), pgUser)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("filling pgbench's tables: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// measurePostgres runs pgbench's select-only transactions from one
// client for the tool duration: its average latency is one round trip
// of a query and its answer.
func measurePostgres(r *runner, c *Case, ip string, port int) (Sample, error) {
	pgbench, err := lookProgram("pgbench")
	if err != nil {
		return Sample{}, err
	}
	args := []string{pgbench, "--select-only", "--no-vacuum", "--client", "1", "--jobs", "1",
		"--host", ip, "--port", strconv.Itoa(port), "--username", pgUser}
	// A connection before the measured one, as a server that has been
	// up a while has seen: the postmaster listens blocking and hands out
	// sockets its backends make non-blocking, so the datapath predicts
	// its first connection blocking (TCP) and learns from its first send.
	if _, err := r.run(r.client, r.clientCPU(c), append(args, "--transactions", "10", pgUser)...); err != nil {
		return Sample{}, err
	}
	secs := strconv.Itoa(max(1, int(r.o.ToolDuration.Round(time.Second)/time.Second)))
	out, err := r.run(r.client, r.clientCPU(c), append(args, "--time", secs, pgUser)...)
	if err != nil {
		return Sample{}, err
	}
	lat, err := parseNumber(out, pgLat, c.Tool)
	if err != nil {
		return Sample{}, err
	}
	tps, err := parseNumber(out, pgTPS, c.Tool)
	return Sample{Mean: lat * 1e3, MsgRate: tps}, err
}
