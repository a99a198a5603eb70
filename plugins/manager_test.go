package plugins_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/molly-gateway/molly/plugins"
)

func TestDescribeReturnsWhatThePluginDeclares(t *testing.T) {
	m := newManager(t,
		plugins.Config{Name: "payments", Path: paymentsBin, SHA256: paymentsSum, Env: map[string]string{"MOLLY_PAYMENTS_DB": t.TempDir() + "/ledger.db"}},
		sleeperConfig())
	cases := []struct {
		name       string
		tool       string
		sideEffect plugins.SideEffect
		argProp    string // a property the args schema must declare
	}{
		{"the payments tool is a money tool with an amount argument", "payments", plugins.Money, "amount"},
		{"the sleeper tool is a read tool with an ms argument", "sleeper", plugins.Read, "ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := m.Describe(c.tool)
			if err != nil {
				t.Fatal(err)
			}
			if d.Name != c.tool || d.SideEffect != c.sideEffect || d.Description == "" {
				t.Fatalf("Describe = %+v, want name %s, side effect %s and a description", d, c.tool, c.sideEffect)
			}
			var args, res struct {
				Type       string                     `json:"type"`
				Properties map[string]json.RawMessage `json:"properties"`
			}
			if err := json.Unmarshal(d.ArgsSchema, &args); err != nil || args.Type != "object" || args.Properties[c.argProp] == nil {
				t.Errorf("args schema %s: want an object schema with %q (err %v)", d.ArgsSchema, c.argProp, err)
			}
			if err := json.Unmarshal(d.ResultSchema, &res); err != nil || res.Type != "object" {
				t.Errorf("result schema %s: want an object schema (err %v)", d.ResultSchema, err)
			}
		})
	}
	if got := strings.Join(m.Names(), ","); got != "payments,sleeper" {
		t.Errorf("Names = %s, want payments,sleeper", got)
	}
	if _, err := m.Describe("nope"); !isCode(err, plugins.CodeNotFound) {
		t.Errorf("Describe(nope) = %v, want not_found", err)
	}
}

func TestInvocationRoundTripsThroughThePluginProcess(t *testing.T) {
	m := newManager(t, sleeperConfig())
	res, err := invoke(t, m, "sleeper", "", map[string]int{"ms": 1})
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ PID int }
	if err := json.Unmarshal(res, &out); err != nil {
		t.Fatal(err)
	}
	if want := m.PIDs()["sleeper"]; out.PID != want || out.PID == os.Getpid() {
		t.Errorf("the tool ran in pid %d, want the plugin's pid %d (not the host's %d)", out.PID, want, os.Getpid())
	}
	if _, err := invoke(t, m, "missing", "", map[string]int{}); !isCode(err, plugins.CodeNotFound) {
		t.Errorf("invoking an unknown tool = %v, want not_found", err)
	}
	if _, err := m.Invoke(t.Context(), "sleeper", plugins.Invocation{Args: json.RawMessage(`[1]`)}); !isCode(err, plugins.CodeInvalidArgument) {
		t.Errorf("invoking with bad args = %v, want the tool's invalid_argument", err)
	}
}

func TestKillingThePluginMidCallYieldsAToolErrorAndARestart(t *testing.T) {
	m := newManager(t, sleeperConfig())
	old := m.PIDs()["sleeper"]
	errc := make(chan error, 1)
	go func() {
		_, err := invoke(t, m, "sleeper", "", map[string]int{"ms": 10000})
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond) // the call is in flight
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !isCode(err, plugins.CodeUnavailable) {
			t.Fatalf("the interrupted call returned %v, want a tool error with code unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupted call did not return within 5 s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := invoke(t, m, "sleeper", "", map[string]int{"ms": 0})
		if err == nil {
			var out struct{ PID int }
			_ = json.Unmarshal(res, &out)
			if out.PID == old || out.PID == 0 {
				t.Fatalf("the call after the restart ran in pid %d, want a new process (old %d)", out.PID, old)
			}
			break
		}
		if !isCode(err, plugins.CodeUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after the kill: %v; want the restarted plugin to answer within 5 s", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if alive(old) {
		t.Errorf("the killed plugin %d is still alive", old)
	}
}

func TestTheSupervisorRestartsACrashedPluginWithoutACall(t *testing.T) {
	m := newManager(t, sleeperConfig())
	old := m.PIDs()["sleeper"]
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pid := m.PIDs()["sleeper"]; pid != 0 && pid != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the supervisor did not restart the killed plugin within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewManagerRefusesBadConfig(t *testing.T) {
	bad := strings.Repeat("0", 64)
	cases := []struct {
		name string
		cfg  plugins.Config
		want string // in the error
		is   error  // errors.Is target, if any
	}{
		{"a binary whose checksum differs from the pinned one does not start", plugins.Config{Name: "payments", Path: paymentsBin, SHA256: bad}, "checksum", plugins.ErrChecksumMismatch},
		{"a checksum that is not 64 hex digits is rejected", plugins.Config{Name: "payments", Path: paymentsBin, SHA256: "abc"}, "sha256 must be 64 hex digits", nil},
		{"a tool name with capitals is rejected", plugins.Config{Name: "Payments", Path: paymentsBin, SHA256: paymentsSum}, "must match", nil},
		{"an empty path is rejected", plugins.Config{Name: "payments", SHA256: paymentsSum}, "path is empty", nil},
		{"a binary describing another name is refused", plugins.Config{Name: "other", Path: selfBin, SHA256: selfSum, Env: map[string]string{"MOLLY_PLUGINS_TEST_ROLE": "sleeper"}}, `describes itself as "sleeper"`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := plugins.NewManager([]plugins.Config{c.cfg}, plugins.Options{Logger: hclog.NewNullLogger()})
			if err == nil {
				m.Close()
				t.Fatal("NewManager succeeded, want an error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %q is not %v", err, c.is)
			}
		})
	}
}

func TestPluginsSeeOnlyTheEnvironmentConfigGrants(t *testing.T) {
	t.Setenv("MOLLY_SECRET_OF_THE_HOST", "hunter2")
	// The sleeper would not even start without its granted role variable;
	// check the converse through /proc: the host's variable is absent.
	m := newManager(t, sleeperConfig())
	env, err := os.ReadFile("/proc/" + itoa(m.PIDs()["sleeper"]) + "/environ")
	if err != nil {
		t.Skipf("cannot read the plugin's environment: %v", err)
	}
	vars := strings.Split(string(env), "\x00")
	for _, v := range vars {
		if strings.HasPrefix(v, "MOLLY_SECRET_OF_THE_HOST=") || strings.HasPrefix(v, "PATH=") {
			t.Errorf("the plugin inherited %q from the host", v)
		}
	}
	if !strings.Contains(string(env), roleEnv+"=sleeper") {
		t.Errorf("the plugin lacks the granted %s", roleEnv)
	}
}

func TestAPluginExitsWhenItsHostIsKilled(t *testing.T) {
	host := exec.Command(selfBin)
	host.Env = append(os.Environ(), roleEnv+"=host", "MOLLY_PLUGINS_TEST_SUM="+selfSum)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Process.Kill(); _ = host.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	var pid int
	select {
	case l := <-line:
		if _, err := fmtSscan(l, &pid); err != nil || pid <= 0 {
			t.Fatalf("the host said %q, want \"pid <n>\"", l)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the host did not report its plugin within 15 s")
	}
	if !alive(pid) {
		t.Fatalf("the plugin %d is not running while its host is", pid)
	}
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	waitGone(t, pid, 5*time.Second)
	reapOrphan(pid)
}

func TestAPluginExitsWhenItsParentDiesEvenWithoutTheDeathSignal(t *testing.T) {
	// The plugin is started by a shell, not by a Manager, so no
	// parent-death signal is set: only the plugin's own watchdog
	// (plugins.Serve) can notice that the shell was killed. The handshake
	// variables are the ones go-plugin's client would pass.
	sh := exec.Command("sh", "-c", `"$0" >/dev/null 2>&1 & echo $!; exec sleep 60`, selfBin)
	sh.Env = []string{roleEnv + "=sleeper", plugins.Handshake.MagicCookieKey + "=" + plugins.Handshake.MagicCookieValue,
		"PLUGIN_PROTOCOL_VERSIONS=1", "PLUGIN_MIN_PORT=10000", "PLUGIN_MAX_PORT=25000"}
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sh.Process.Kill(); _ = sh.Wait() }()
	s, _ := bufio.NewReader(out).ReadString('\n')
	var pid int
	if _, err := fmtSscanPlain(strings.TrimSpace(s), &pid); err != nil || pid <= 0 {
		t.Fatalf("the shell said %q, want a pid", s)
	}
	time.Sleep(300 * time.Millisecond) // the plugin is serving
	if !alive(pid) {
		t.Fatalf("the plugin %d exited while its parent lives", pid)
	}
	if err := sh.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = sh.Wait()
	waitGone(t, pid, 5*time.Second)
	reapOrphan(pid)
}

func isCode(err error, code string) bool {
	var te *plugins.ToolError
	return errors.As(err, &te) && te.Code == code
}
