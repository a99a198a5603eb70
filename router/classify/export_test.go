package classify

import (
	"strings"

	"github.com/molly-gateway/molly/redaction"
)

// FailScansOn makes c's detector fail (panic, as a detector bug or a
// resource failure would) on any text containing marker, so that tests of
// the fail-closed paths, here and in package classify_test (egress,
// pipeline), can get a ScanFailed annotation: no configuration can.
func FailScansOn(c *Classifier, marker string) *Classifier {
	scan := c.scan
	c.scan = func(text string) ([]redaction.Finding, error) {
		if strings.Contains(text, marker) {
			panic("detector failure")
		}
		return scan(text)
	}
	return c
}
