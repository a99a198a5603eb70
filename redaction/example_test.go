package redaction_test

import (
	"fmt"

	"github.com/molly-gateway/molly/redaction"
)

// One Scanner per process, one Vault per request: redact what the policy
// says before the prompt leaves, restore the answer as it streams back.
func Example() {
	scanner, err := redaction.NewScanner(redaction.Config{DefaultRegion: "IT"})
	if err != nil {
		panic(err)
	}
	prompt := "Scrivi a mario.rossi@example.it o chiama il 333 123 4567."
	findings := scanner.Scan(prompt)

	vault := redaction.NewVault()
	redacted := vault.Redact(prompt, findings, map[string]bool{redaction.TypeEmail: true, redaction.TypePhone: true})
	fmt.Println(redacted)

	// The upstream answers in chunks that cut a placeholder in two.
	r := vault.NewStreamRestorer()
	for _, chunk := range []string{"Ho scritto a [EMA", "IL_1] e chiamato [PHONE_1]."} {
		fmt.Print(r.Write(chunk))
	}
	fmt.Println(r.Flush())
	// Output:
	// Scrivi a [EMAIL_1] o chiama il [PHONE_1].
	// Ho scritto a mario.rossi@example.it e chiamato 333 123 4567.
}

// Tool-call arguments are JSON: RedactJSON keeps them JSON (a number
// becomes a quoted placeholder) and RestoreJSON puts the number back.
func ExampleVault_RedactJSON() {
	scanner, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		panic(err)
	}
	args := `{"card": 4111111111111111, "notify": true}`
	vault := redaction.NewVault()
	redacted := vault.RedactJSON(args, scanner.Scan(args), map[string]bool{redaction.TypeCreditCard: true})
	fmt.Println(redacted)
	fmt.Println(string(vault.RestoreJSON([]byte(redacted))))
	// Output:
	// {"card": "[CREDIT_CARD_1]", "notify": true}
	// {"card": 4111111111111111, "notify": true}
}

// Answers are guarded with the same detectors: the policy masks e-mail
// addresses the model wrote, but not the one the gateway restored.
func ExampleGuard() {
	scanner, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		panic(err)
	}
	vault := redaction.NewVault()
	vault.Redact("mail mario.rossi@example.it", scanner.Scan("mail mario.rossi@example.it"), map[string]bool{redaction.TypeEmail: true})
	guard := scanner.NewGuard(redaction.GuardPolicy{Actions: map[string]redaction.GuardAction{redaction.TypeEmail: redaction.GuardMask}}, vault.Values()...)
	answer := vault.Restore("Write to [EMAIL_1] and cc anna.verdi@example.org.")
	out, _, err := guard.Check(answer)
	fmt.Println(out, err)
	// Output:
	// Write to mario.rossi@example.it and cc [EMAIL]. <nil>
}
