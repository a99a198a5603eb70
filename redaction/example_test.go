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
