package classify

import (
	"fmt"
	"strings"
)

// Sensitivity is the sovereignty class of a request, ordered
// public < internal < confidential < restricted.
type Sensitivity int

// Sensitivity classes, lowest first.
const (
	Public Sensitivity = iota
	Internal
	Confidential
	Restricted
)

var sensitivityNames = [...]string{"public", "internal", "confidential", "restricted"}

func (s Sensitivity) String() string {
	if s < Public || s > Restricted {
		return fmt.Sprintf("Sensitivity(%d)", int(s))
	}
	return sensitivityNames[s]
}

// ParseSensitivity reads a class name (case-insensitive).
func ParseSensitivity(name string) (Sensitivity, error) {
	for i, n := range sensitivityNames {
		if strings.EqualFold(strings.TrimSpace(name), n) {
			return Sensitivity(i), nil
		}
	}
	return 0, fmt.Errorf("unknown sensitivity class %q (want one of public, internal, confidential, restricted)", name)
}

// MarshalText writes the class name.
func (s Sensitivity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a class name.
func (s *Sensitivity) UnmarshalText(b []byte) error {
	v, err := ParseSensitivity(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// DefaultEntityClasses maps each entity type to the sensitivity class its
// presence implies. Secrets and credentials pin a request on-device;
// financial identifiers keep it inside the LAN; contact data keeps it on
// self-hosted tiers. Unlisted types count as Confidential. What each class
// may reach is Rego's to say (policies/residency.rego).
var DefaultEntityClasses = map[string]Sensitivity{
	"SECRET":          Restricted,
	"URL_CREDENTIALS": Restricted,
	"CREDIT_CARD":     Confidential,
	"IBAN":            Confidential,
	"US_SSN":          Confidential,
	"IT_FISCAL_CODE":  Confidential,
	"PERSON":          Confidential,
	"EMAIL":           Internal,
	"PHONE":           Internal,
	"IP_ADDRESS":      Internal,
}
