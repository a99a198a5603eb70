package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// benchUpstreamEnv makes the test binary a static upstream process on the
// address it holds (TestMain): the black-box rows' upstream runs apart
// from both the gateway and the load generator, as in a deployment.
const benchUpstreamEnv = "MOLLY_BENCH_UPSTREAM_ADDR"

// serveStaticUpstream serves the static answers on addr until killed.
func serveStaticUpstream(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "static upstream:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, (&http.Server{Handler: staticHandler()}).Serve(l))
	os.Exit(1)
}

// startBlackBoxPair runs the bench's config in the real molly binary (both
// sites in one process, as `molly run` starts them) in front of a static
// upstream in a third process; this process is only the load generator.
// Idle waits, after either path's requests, until the molly process is
// idle, so that work it does after answering (the usage journal) is not
// timed with the next path's requests.
func startBlackBoxPair(b *testing.B) (*benchPair, *processCPU) {
	b.Helper()
	upHost := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	up := exec.Command(os.Args[0], "-test.run=^$")
	up.Env = append(os.Environ(), benchUpstreamEnv+"="+upHost)
	up.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives the bench
	var upLog bytes.Buffer
	up.Stderr = &upLog
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = up.Process.Kill()
		_ = up.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", upHost)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the static upstream did not start: %v\n%s", err, upLog.String())
		}
	}
	pport := freePort(b)
	g := startMolly(b, benchCaddyfile(filepath.Join(b.TempDir(), "molly.log"), upHost, "{PORT}", pport))
	cpu := &processCPU{pid: g.cmd.Process.Pid}
	tr := &http.Transport{MaxIdleConns: 4 * benchClients, MaxIdleConnsPerHost: 2 * benchClients, IdleConnTimeout: time.Minute}
	b.Cleanup(tr.CloseIdleConnections)
	p := &benchPair{
		molly:  g.URL + "/chat/completions",
		proxy:  fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", pport),
		client: &http.Client{Transport: tr, Timeout: time.Minute},
		idle:   cpu.waitIdle,
	}
	p.warm(b)
	return p, cpu
}

// processCPU reads a process's CPU time: the sum over its threads of
// /proc/<pid>/task/<tid>/schedstat's first field (nanoseconds on a CPU,
// proc(5)), finer than the clock ticks of /proc/<pid>/stat.
type processCPU struct{ pid int }

func (c *processCPU) used(b *testing.B) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", c.pid))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("reading the CPU time of process %d: %v (%d threads)", c.pid, err, len(tasks))
	}
	var sum time.Duration
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended
		}
		f := bytes.Fields(raw)
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			b.Fatalf("%s: %q", t, raw)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// waitIdle returns once the process used under 0.5 ms of CPU in each of
// two consecutive 5 ms windows (at most 2 s).
func (c *processCPU) waitIdle(b *testing.B) {
	quiet := 0
	last := c.used(b)
	for deadline := time.Now().Add(2 * time.Second); quiet < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		now := c.used(b)
		if now-last < 500*time.Microsecond {
			quiet++
		} else {
			quiet = 0
		}
		last = now
	}
}

// blackbox adds the black-box rows: the latency and throughput rows of
// suite, measured against the molly binary, plus the molly process's CPU
// time per request on each path.
func (t *benchTable) blackbox(b *testing.B, rounds int) {
	p, cpu := startBlackBoxPair(b)
	two, big := benchBody(2<<10, false), benchBody(32<<10, false)
	var addP50, addP99, ratio, proxyP50, proxyP99, add32, proxy32, thrRatio, thrProxy, cpuRatio, cpuMolly, cpuProxy []float64
	burst := func(url string) (rps float64, cpuPerReq float64) {
		before := cpu.used(b)
		rps = p.burst(b, url, two, benchBurst) // ends when the process is idle
		return rps, float64(cpu.used(b)-before) / 1e3 / benchBurst
	}
	for r := range rounds {
		m, px := p.latencies(b, two, benchSizes[0].n)
		mp50, pp50 := quantile(m, 0.5), quantile(px, 0.5)
		addP50, proxyP50, ratio = append(addP50, mp50-pp50), append(proxyP50, pp50), append(ratio, mp50/pp50)
		addP99, proxyP99 = append(addP99, quantile(m, 0.99)-quantile(px, 0.99)), append(proxyP99, quantile(px, 0.99))
		m, px = p.latencies(b, big, benchSizes[1].n)
		add32, proxy32 = append(add32, quantile(m, 0.5)-quantile(px, 0.5)), append(proxy32, quantile(px, 0.5))
		var mr, pr, mc, pc float64
		if r%2 == 0 {
			mr, mc = burst(p.molly)
			pr, pc = burst(p.proxy)
		} else {
			pr, pc = burst(p.proxy)
			mr, mc = burst(p.molly)
		}
		thrRatio, thrProxy = append(thrRatio, mr/pr), append(thrProxy, pr)
		cpuRatio, cpuMolly, cpuProxy = append(cpuRatio, mc/pc), append(cpuMolly, mc), append(cpuProxy, pc)
	}
	us := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "us" }
	t.add(goal(row{name: "blackbox.chat_2KB_c1.p50_added", value: median(addP50), unit: "us", base: "caddy_p50=" + us(median(proxyP50))}, 150))
	t.add(goal(row{name: "blackbox.chat_2KB_c1.p99_added", value: median(addP99), unit: "us", base: "caddy_p99=" + us(median(proxyP99))}, 300))
	t.add(goal(row{name: "blackbox.chat_2KB_c1.latency_ratio", value: median(ratio), unit: "x", base: "caddy_p50", report: "blackbox_latency_ratio"}, 1.5))
	t.add(goal(row{name: "blackbox.chat_32KB_c1.p50_added", value: median(add32), unit: "us", base: "caddy_p50=" + us(median(proxy32))}, 1000))
	t.add(goal(row{name: "blackbox.throughput_16c.ratio", value: median(thrRatio), unit: "x", base: fmt.Sprintf("caddy=%.0freq/s", median(thrProxy)), higher: true, report: "blackbox_throughput_ratio"}, 0.6))
	t.add(row{name: "blackbox.cpu_per_req_2KB.ratio", value: median(cpuRatio), unit: "x", base: fmt.Sprintf("caddy=%s", us(median(cpuProxy)))})
	t.add(row{name: "blackbox.cpu_per_req_2KB.molly", value: median(cpuMolly), unit: "us"})
}
