package router

import "testing"

// The estimator's own tests, labelled sets and benchmarks are in
// router/capability; this one checks the classifier's use of it.

func TestClassifierUsesTheAdapterDomains(t *testing.T) {
	c := NewClassifier(testScanner(t), nil)
	body := `{"model":"m","messages":[{"role":"user","content":"Why was my card payment declined at checkout?"}]}`
	a, err := c.Classify(EndpointChat, []byte(body), "", "")
	if err != nil || a.Task != "chat" {
		t.Fatalf("without domains: task %q, %v; want chat", a.Task, err)
	}
	c.SetDomains(func() []string { return []string{"payments"} })
	a, err = c.Classify(EndpointChat, []byte(body), "", "")
	want := NewEstimator(func() []string { return []string{"payments"} }).Estimate("Why was my card payment declined at checkout?", false)
	if err != nil || a.Task != "payments" || a.Difficulty != want.Difficulty || a.Difficulty <= 0 {
		t.Fatalf("with payments: task %q difficulty %v, %v; want payments, %v", a.Task, a.Difficulty, err, want.Difficulty)
	}
}
