package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/registry"
)

// usageTimeout bounds one record_usage call.
const usageTimeout = 10 * time.Second

// UsageCaller is the member the gateway records usage as (the caller of
// record_usage; the usage itself is booked to the record's member).
const UsageCaller = "molly-gateway"

// usageDeliveries counts the outbox's delivery attempts, by outcome
// (delivered, retry, failed); usageOutbox reports the outbox of the running
// app's usage tool (pending, failed).
var (
	usageDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "molly_usage_deliveries_total",
		Help: "Usage records sent to the usage tool, by outcome: delivered, retry (sent again later), failed (refused for good)."}, []string{"outcome"})
	usageOutbox = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "molly_usage_outbox_pending",
		Help: "Usage records committed in the registry and not yet acknowledged by the usage tool."}, func() float64 { return outboxCount(false) })
	usageFailed = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "molly_usage_outbox_failed",
		Help: "Usage records the usage tool refused for good (see the log; requeue once fixed)."}, func() float64 { return outboxCount(true) })
	usageJournal = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "molly_usage_journal_pending",
		Help: "Usage records durable in this process's usage journal and not yet committed in the registry's ledger (normally 0 or a few; growing: the registry fails, see molly_usage_journal_failing)."},
		func() float64 { return journalStat(false) })
	usageJournalFailing = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "molly_usage_journal_failing",
		Help: "1 while the usage journal's commits into the registry fail (they are retried; nothing is lost), else 0."},
		func() float64 { return journalStat(true) })
)

func journalStat(failing bool) float64 {
	a := Current()
	if a == nil || a.registry == nil {
		return 0
	}
	s := a.registry.JournalStats()
	if failing {
		if s.Err != nil {
			return 1
		}
		return 0
	}
	return float64(s.Pending)
}

func outboxCount(failed bool) float64 {
	a := Current()
	if a == nil || a.registry == nil || a.UsageTool == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := a.registry.Outbox(ctx, a.UsageTool)
	if err != nil {
		return 0
	}
	if failed {
		return float64(s.Failed)
	}
	return float64(s.Pending)
}

func registerUsageMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{usageDeliveries, usageOutbox, usageFailed, usageJournal, usageJournalFailing} {
		if err := reg.Register(c); err != nil {
			if _, ok := err.(prometheus.AlreadyRegisteredError); !ok {
				return err
			}
		}
	}
	return nil
}

// provisionUsage registers the usage tool as an outbox sink of the
// registry before any request is served, so that every usage record from
// now on, in this process or another on the file, is queued for it.
func (a *App) provisionUsage(ctx context.Context) error {
	if a.UsageTool == "" {
		return nil
	}
	return a.registry.RegisterSink(ctx, a.UsageTool)
}

// startUsage starts delivering the outbox (records of earlier runs
// included) to the usage tool.
func (a *App) startUsage() error {
	if a.UsageTool == "" {
		return nil
	}
	log := a.logger.Named("usage")
	d, err := a.registry.Deliver(context.Background(), a.UsageTool, plugins.RecordUsage(a.tools, a.UsageTool, UsageCaller), registry.DeliveryOptions{
		Timeout: usageTimeout,
		Observe: func(at registry.Attempt) {
			usageDeliveries.WithLabelValues(at.Outcome).Inc()
			// Record ids, members and the tool's code: never prompt text.
			switch at.Outcome {
			case "retry":
				log.Warn("recording usage in the usage tool failed; it is sent again later", zap.String("tool", at.Sink),
					zap.String("record_id", at.Usage.RecordID), zap.String("member", at.Usage.Member), zap.Int("attempt", at.N),
					zap.Time("next", at.Next), zap.Error(at.Err))
			case "failed":
				log.Error("the usage tool refused a usage record for good", zap.String("tool", at.Sink),
					zap.String("record_id", at.Usage.RecordID), zap.String("member", at.Usage.Member), zap.Error(at.Err))
			}
		},
	})
	if err != nil {
		return err
	}
	a.usage = d
	return nil
}

// stopUsage stops the deliverer once its sends in flight are over (each
// bounded by usageTimeout); what is pending stays for the next start.
func (a *App) stopUsage() {
	if a.usage != nil {
		a.usage.Close()
		a.usage = nil
	}
}

// UsageDelivery returns the counts of the usage tool's deliverer, or false
// when none runs.
func (a *App) UsageDelivery() (registry.DeliveryStats, bool) {
	if a.usage == nil {
		return registry.DeliveryStats{}, false
	}
	return a.usage.Stats(), true
}
