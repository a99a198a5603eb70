// Package pgtest starts a throwaway PostgreSQL cluster for tests: Debian's
// postgresql package (initdb, pg_ctl; `make deps` installs it), a data
// directory under the temporary directory, a loopback port, trust
// authentication for a superuser named molly — one cluster per test
// binary, started on first use, and a fresh schema per test (cheaper than
// a database: the DSN selects it with search_path). PostgreSQL
// refuses to run as root, so when the tests run as root the cluster runs
// as the package's system user (postgres). Durability settings are off
// (fsync, synchronous_commit): the cluster is for coordination tests, not
// crash tests.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrUnavailable reports that no cluster can be started here; the message
// says why (the programs are missing, no user to run them as).
var ErrUnavailable = errors.New("PostgreSQL is not available")

type cluster struct {
	dir   string // owns data/, the socket and the log
	bin   string // the folder of initdb, pg_ctl, postgres
	cred  *syscall.Credential
	admin string // DSN of the postgres database
}

var (
	once    sync.Once
	running *cluster
	failure error
	dbs     atomic.Int64
)

// DSN returns the DSN of a new, empty schema on the test binary's cluster
// (its search_path; dropped when tb ends), starting the cluster on first
// use. When
// PostgreSQL cannot run here, tb is skipped and the reason stated; any
// other failure fails tb.
func DSN(tb testing.TB) string {
	tb.Helper()
	once.Do(func() { running, failure = start() })
	if errors.Is(failure, ErrUnavailable) {
		tb.Skipf("skipping the PostgreSQL test: %v (make deps installs Debian's postgresql package)", failure)
	}
	if failure != nil {
		tb.Fatalf("starting PostgreSQL: %v", failure)
	}
	name := fmt.Sprintf("molly_test_%d_%d", os.Getpid(), dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, running.admin)
	if err != nil {
		tb.Fatalf("connecting to the test cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		tb.Fatalf("creating schema %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, running.admin); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
			conn.Close(ctx)
		}
	})
	return running.admin + "&search_path=" + name
}

// Stop stops the cluster, if one was started, and removes its directory:
// call it from TestMain after m.Run.
func Stop() {
	if running == nil {
		return
	}
	c := running
	cmd := exec.Command(filepath.Join(c.bin, "pg_ctl"), "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	_ = cmd.Run()
	os.RemoveAll(c.dir)
	running = nil
}

// binDir finds initdb: on the PATH, else the newest Debian install.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("%w: initdb is neither on the PATH nor under /usr/lib/postgresql", ErrUnavailable)
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return filepath.Dir(found[0]), nil
}

func version(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func start() (*cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin}
	if c.dir, err = os.MkdirTemp("", "molly-pg-"); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(c.dir)
			return nil, fmt.Errorf("%w: the tests run as root, which PostgreSQL refuses, and there is no postgres user to run it as", ErrUnavailable)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			os.RemoveAll(c.dir)
			return nil, err
		}
	}
	run := func(name string, args ...string) error {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = c.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "TZ=UTC")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s", name, err, out)
		}
		return nil
	}
	data := filepath.Join(c.dir, "data")
	if err := run("initdb", "-D", data, "-U", "molly", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300", port, c.dir)
	if err := run("pg_ctl", "-D", data, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		os.RemoveAll(c.dir)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	c.admin = fmt.Sprintf("postgres://molly@127.0.0.1:%d/postgres?sslmode=disable", port)
	return c, nil
}
