package canarytest

import (
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestCanaryOracleSeesEveryForm checks the oracle itself: it finds the
// canary in each shape it may take in a received body, and not in a
// redacted one.
func TestCanaryOracleSeesEveryForm(t *testing.T) {
	canary := Skeleton("MOLLY-CANARY-0A1B2C3D")
	for _, body := range []string{
		`{"a":"MOLLY-CANARY-0A1B2C3D"}`,
		`{"a":"MOLLY\u002dCANARY\u002d0A1B2C3D"}`,
		`{"MOLLY-CANARY-0A1B2C3D":1}`,
		`{"a":"data:text/plain;base64,` + base64.StdEncoding.EncodeToString([]byte("x MOLLY-CANARY-0A1B2C3D")) + `"}`,
		`{"a":"MOLLY%2DCANARY%2D0A1B2C3D"}`,
	} {
		if !Leaked([]byte(body), canary) {
			t.Errorf("the oracle misses the canary in %s", body)
		}
	}
	if Leaked([]byte(`{"a":"[CANARY_1]","b":"[CREDIT_CARD_1]"}`), canary) || Leaked([]byte(`{"seed":"[CREDIT_CARD_1]"}`), Skeleton(Card)) {
		t.Error("the oracle flags a redacted body")
	}
	if !Leaked([]byte(`{"seed":4111111111111111}`), Skeleton(Card)) {
		t.Error("the oracle misses a card number sent as a JSON number")
	}
}

// TestGenerateIsDeterministic checks the generator: the same seed gives
// the same case, each a valid JSON body with a canary, and a tool result
// exactly for the tools strategy.
func TestGenerateIsDeterministic(t *testing.T) {
	a, b := rand.New(rand.NewPCG(3, 4)), rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		x, y := Generate(a), Generate(b)
		if string(x.Body) != string(y.Body) || x.Strategy != y.Strategy || x.Tool != y.Tool {
			t.Fatalf("case %d differs between two generators with one seed", i)
		}
		if !json.Valid(x.Body) || x.Canary == "" || (x.Strategy == "tools") != (x.Tool != "") {
			t.Fatalf("case %d is not a valid case (canary %q): %s", i, x.Canary, x.Body)
		}
	}
}
