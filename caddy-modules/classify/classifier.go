package classify

import "github.com/molly-gateway/molly/router/classify"

// Classifier returns the classifier Provision built (nil before): the
// molly_envoy app configures its policy point's classifier with the same
// options as molly_classify.
func (c *Classify) Classifier() *classify.Classifier { return c.classifier }
