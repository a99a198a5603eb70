package plugins_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/molly-gateway/molly/plugins"
)

// The test binary plays four parts, chosen by MOLLY_PLUGINS_TEST_ROLE:
// the tests themselves (unset); a tool plugin, "sleeper", whose calls take
// as long as asked (so a test can kill it mid-call); a host process that
// runs a Manager until it is killed (so a test can kill a host); and
// "usagehost", the usage side of a gateway (usage_delivery_test.go).
const roleEnv = "MOLLY_PLUGINS_TEST_ROLE"

var (
	paymentsBin string // the payments plugin, built by TestMain
	paymentsSum string
	billingBin  string // the billing plugin, built by TestMain
	billingSum  string
	supportBin  string // the support plugin, built by TestMain
	supportSum  string
	selfBin     string // this test binary, which also serves as "sleeper"
	selfSum     string
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "sleeper":
		plugins.Serve(sleeper{})
		os.Exit(0)
	case "host":
		runHost()
		os.Exit(0)
	case "usagehost":
		runUsageHost()
		os.Exit(0)
	}
	becomeSubreaper()
	dir, err := os.MkdirTemp("", "molly-plugins-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	paymentsBin = filepath.Join(dir, "payments")
	billingBin = filepath.Join(dir, "billing")
	supportBin = filepath.Join(dir, "support")
	code := func() int {
		defer os.RemoveAll(dir)
		// One go build for every plugin: the packages share most of their
		// dependencies (SQLite, gRPC), so building them together is faster.
		out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./payments", "./billing", "./support").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building the plugins: %v\n%s", err, out)
			return 1
		}
		for _, b := range []struct{ bin, sum *string }{{&paymentsBin, &paymentsSum}, {&billingBin, &billingSum}, {&supportBin, &supportSum}} {
			if *b.sum, err = fileSum(*b.bin); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		if selfBin, err = os.Executable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if selfSum, err = fileSum(selfBin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sleeper is a read tool for the tests: args {"ms": n} → {"pid": its pid}
// after n milliseconds (or the call's cancellation).
type sleeper struct{}

func (sleeper) Describe(context.Context) (plugins.Description, error) {
	return plugins.Description{
		Name:         "sleeper",
		Description:  "Sleeps for ms milliseconds and returns its process id.",
		ArgsSchema:   json.RawMessage(`{"type":"object","properties":{"ms":{"type":"integer","minimum":0}}}`),
		ResultSchema: json.RawMessage(`{"type":"object","properties":{"pid":{"type":"integer"}}}`),
		SideEffect:   plugins.Read,
	}, nil
}

func (sleeper) Invoke(ctx context.Context, inv plugins.Invocation) (json.RawMessage, error) {
	var a struct {
		MS int `json:"ms"`
	}
	if err := json.Unmarshal(inv.Args, &a); err != nil {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%v", err)
	}
	select {
	case <-time.After(time.Duration(a.MS) * time.Millisecond):
	case <-ctx.Done():
		return nil, plugins.Errorf(plugins.CodeUnavailable, "canceled")
	}
	return json.Marshal(map[string]int{"pid": os.Getpid()})
}

func sleeperConfig() plugins.Config {
	return plugins.Config{Name: "sleeper", Path: selfBin, SHA256: selfSum, Env: map[string]string{roleEnv: "sleeper"}}
}

// runHost is the "host" role: it starts a Manager with the sleeper, prints
// "pid <n>" for the plugin and waits to be killed.
func runHost() {
	m, err := plugins.NewManager([]plugins.Config{{Name: "sleeper", Path: os.Args[0], SHA256: os.Getenv("MOLLY_PLUGINS_TEST_SUM"),
		Env: map[string]string{roleEnv: "sleeper"}}}, plugins.Options{Logger: hclog.NewNullLogger()})
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Printf("pid %d\n", m.PIDs()["sleeper"])
	select {}
}

// newManager starts a manager for the test and closes it at the end,
// checking that no plugin process it ever ran outlives Close.
func newManager(t *testing.T, cfgs ...plugins.Config) *plugins.Manager {
	t.Helper()
	m, err := plugins.NewManager(cfgs, plugins.Options{
		Logger:         hclog.NewNullLogger(),
		HealthInterval: 200 * time.Millisecond,
		MinBackoff:     50 * time.Millisecond,
		MaxBackoff:     time.Second,
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	seen := map[int]bool{}
	track := func() {
		for _, pid := range m.PIDs() {
			seen[pid] = true
		}
	}
	track()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // remember every pid, restarts included
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				track()
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		track()
		m.Close()
		for pid := range seen {
			waitGone(t, pid, 5*time.Second)
		}
	})
	return m
}

// alive reports whether pid is a live process (present in /proc and not a
// zombie waiting for a reaper).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	state := s[i+2]
	return state != 'Z' && state != 'X'
}

func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Errorf("plugin process %d is still running %v later", pid, within)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func invoke(t *testing.T, m *plugins.Manager, tool, key string, args any) (json.RawMessage, error) {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.Invoke(ctx, tool, plugins.Invocation{Args: b, Caller: plugins.Caller{Member: "alice", Scopes: []string{"tools:" + tool}}, IdempotencyKey: key})
}

func itoa(n int) string { return fmt.Sprint(n) }

func fmtSscan(line string, pid *int) (int, error) { return fmt.Sscanf(line, "pid %d", pid) }

func fmtSscanPlain(line string, pid *int) (int, error) { return fmt.Sscanf(line, "%d", pid) }
