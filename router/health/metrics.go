package health

import "github.com/prometheus/client_golang/prometheus"

var (
	descEjected = prometheus.NewDesc("molly_target_ejected",
		"1 while the target's circuit is open or half-open (outlier detection), else 0.", []string{"target"}, nil)
	descState = prometheus.NewDesc("molly_target_circuit_state",
		"The target's circuit: 1 for its current state (closed, open, half_open), 0 for the others.", []string{"target", "state"}, nil)
	descConsecutive = prometheus.NewDesc("molly_target_consecutive_failures",
		"Failed attempts in a row since the target's last success.", []string{"target"}, nil)
	descEjections = prometheus.NewDesc("molly_target_ejections_total",
		"Ejections by reason (consecutive_5xx, failure_percentage, latency, probe_failed; skipped_max_ejection_percent for those refused).",
		[]string{"target", "reason"}, nil)
)

// Collector exposes t's state to Prometheus, read at scrape time (nothing
// is counted on the request path).
func (t *Tracker) Collector() prometheus.Collector { return collector{t} }

type collector struct{ t *Tracker }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEjected
	ch <- descState
	ch <- descConsecutive
	ch <- descEjections
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.t.Snapshot() {
		ejected := 0.0
		if s.State != StateClosed {
			ejected = 1
		}
		ch <- prometheus.MustNewConstMetric(descEjected, prometheus.GaugeValue, ejected, s.Target)
		for _, st := range []string{StateClosed, StateOpen, StateHalfOpen} {
			v := 0.0
			if s.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, s.Target, st)
		}
		ch <- prometheus.MustNewConstMetric(descConsecutive, prometheus.GaugeValue, float64(s.ConsecutiveFailures), s.Target)
		for _, r := range []string{ReasonConsecutive5xx, ReasonFailurePercentage, ReasonLatency, ReasonProbe, "skipped_max_ejection_percent"} {
			ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(s.EjectionsTotal[r]), s.Target, r)
		}
	}
}
