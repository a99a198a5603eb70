package router

import "github.com/molly-gateway/molly/router/capability"

// The capability estimator lives in package capability (router/capability);
// these names keep router's callers and tests unchanged.

// Task categories: see capability.TaskChat and friends.
const (
	TaskChat           = capability.TaskChat
	TaskCoding         = capability.TaskCoding
	TaskMath           = capability.TaskMath
	TaskExtraction     = capability.TaskExtraction
	TaskSummarisation  = capability.TaskSummarisation
	TaskTranslation    = capability.TaskTranslation
	TaskCreative       = capability.TaskCreative
	TaskClassification = capability.TaskClassification
	TaskEmbedding      = capability.TaskEmbedding
)

// Tasks lists the built-in categories in tie-break order (capability.Tasks).
var Tasks = capability.Tasks

// ChatBias is the score chat starts with (capability.ChatBias).
const ChatBias = capability.ChatBias

// Estimator is the capability estimator (capability.Estimator).
type Estimator = capability.Estimator

// Estimate is one prompt's capability estimate (capability.Estimate).
type Estimate = capability.Estimate

// CategoryScore is one category's score (capability.CategoryScore).
type CategoryScore = capability.CategoryScore

// NewEstimator returns an estimator whose adapter domains come from domains
// (nil: none); see capability.NewEstimator.
func NewEstimator(domains func() []string) *Estimator { return capability.NewEstimator(domains) }

// SetDomains makes the classifier treat the names domains returns (the T0
// engine's adapter names, read on every request) as task categories. Call it
// before the classifier serves.
func (c *Classifier) SetDomains(domains func() []string) { c.estimator = NewEstimator(domains) }

// estimate is the classifier's one call into the estimator; entropy is
// the category distribution's, in nats (Estimate.Entropy).
func (c *Classifier) estimate(text string, tools bool) (task string, difficulty, entropy float64) {
	e := c.estimator.Estimate(text, tools)
	return e.Task, e.Difficulty, e.Entropy()
}
