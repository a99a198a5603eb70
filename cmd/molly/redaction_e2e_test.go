package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
)

// redactionClassify declares a user-defined type, makes it and e-mail
// addresses public (so T3 is allowed and the default policy redacts them
// for it), and pseudonymises e-mail addresses with a keyed HMAC.
const redactionClassify = "pattern PROJECT_CODE `PRJ-\\d{4}`\n" +
	"		sensitivity PROJECT_CODE public\n" +
	"		sensitivity EMAIL public\n" +
	"		redact_mode EMAIL hash\n" +
	"		hash_key_env MOLLY_TEST_HASH_KEY"

const testHashKey = "0123456789abcdef0123456789abcdef-e2e"

func TestRedactionCustomPatternIsRedactedForT3AndRestored(t *testing.T) {
	t.Setenv("MOLLY_TEST_HASH_KEY", testHashKey)
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", redactionClassify))
	c := client(g)
	prompt := "Summarise the risks of PRJ-4711, then compare PRJ-4711 with PRJ-0815"
	var resp *http.Response
	out, err := c.Chat.Completions.New(context.Background(), chat(prompt), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Molly-Tier") != "T3" {
		t.Fatalf("tier %q, want T3", resp.Header.Get("X-Molly-Tier"))
	}
	got := tr.t3.Received()
	if len(got) != 1 || !strings.Contains(string(got[0]), "Summarise the risks of [PROJECT_CODE_1], then compare [PROJECT_CODE_1] with [PROJECT_CODE_2]") {
		t.Fatalf("T3 received %s, want the codes as placeholders", got)
	}
	if want := "t3 says: " + prompt; out.Choices[0].Message.Content != want {
		t.Fatalf("answer %q, want %q", out.Choices[0].Message.Content, want)
	}
	// Streamed, with the placeholders cut across chunks.
	tr.t3.Chunks = 23
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat(prompt))
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if want := "t3 says: " + prompt; text.String() != want {
		t.Fatalf("streamed %q, want %q", text.String(), want)
	}
	if tr.t3.Contains("PRJ-4711") || tr.t3.Contains("PRJ-0815") {
		t.Fatal("T3 received a project code")
	}
}

func TestRedactionHashModeGivesAStableIrreversibleToken(t *testing.T) {
	t.Setenv("MOLLY_TEST_HASH_KEY", testHashKey)
	tr := startTiers(t)
	cfg := tr.caddyfile("", redactionClassify)
	token := regexp.MustCompile(`\[EMAIL#[0-9a-f]{16}\]`)
	ask := func(g *gateway, prompt string) (sent, answer string) {
		t.Helper()
		n := tr.t3.Count()
		out, err := client(g).Chat.Completions.New(context.Background(), chat(prompt))
		if err != nil {
			t.Fatal(err)
		}
		got := tr.t3.Received()
		if len(got) != n+1 {
			t.Fatalf("T3 got %d requests, want %d", len(got), n+1)
		}
		return string(got[n]), out.Choices[0].Message.Content
	}

	g := startMolly(t, cfg)
	sent1, answer1 := ask(g, "Write to anna@example.org about PRJ-1234")
	tok := token.FindString(sent1)
	if tok == "" || strings.Contains(sent1, "anna@example.org") || !strings.Contains(sent1, "[PROJECT_CODE_1]") {
		t.Fatalf("T3 received %s, want a pseudonym for the address and a placeholder for the code", sent1)
	}
	// The pseudonym is not restored: the answer keeps it, the code comes back.
	if want := "t3 says: Write to " + tok + " about PRJ-1234"; answer1 != want {
		t.Fatalf("answer %q, want %q", answer1, want)
	}
	// Another request, and another Molly process with the same key, give
	// the same pseudonym; another address gets another one.
	sent2, _ := ask(g, "Remind anna@example.org, and cc bob@example.org")
	g2 := startMolly(t, cfg)
	sent3, _ := ask(g2, "anna@example.org again")
	if toks := token.FindAllString(sent2, -1); len(toks) != 2 || toks[0] != tok || toks[1] == tok {
		t.Fatalf("second request sent %s, want %s then another pseudonym", sent2, tok)
	}
	if !strings.Contains(sent3, tok) {
		t.Fatalf("after a restart T3 received %s, want %s", sent3, tok)
	}
	for _, gw := range []*gateway{g, g2} {
		if strings.Contains(gw.logs.String(), testHashKey) || strings.Contains(gw.logs.String(), "anna@example.org") {
			t.Fatal("the logs hold the HMAC key or the address")
		}
	}
}
