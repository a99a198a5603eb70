package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/tidwall/gjson"
)

// orderSchema is a pydantic model as pydantic writes it, with the keywords
// clients send for constrained fields: conint (minimum, maximum),
// confloat (exclusiveMinimum), constr (pattern), a nested model as an
// allOf of its $ref beside a description, and an Optional.
const orderSchema = `{
  "$defs": {"Address": {"title": "Address", "type": "object",
    "properties": {"zip": {"title": "Zip", "type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]}},
  "title": "Order", "type": "object",
  "properties": {
    "qty": {"title": "Qty", "type": "integer", "minimum": 1, "maximum": 100},
    "price": {"title": "Price", "type": "number", "exclusiveMinimum": 0, "maximum": 1000},
    "sku": {"title": "Sku", "type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "ship_to": {"allOf": [{"$ref": "#/$defs/Address"}], "description": "where to"},
    "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}], "default": null, "title": "Note"}
  },
  "required": ["qty", "price", "sku", "ship_to"]
}`

// TestStructuredOutputWithConstrainedFieldsOnTheEngine: through the real
// molly binary, a response_format json_schema with minimum, maximum,
// exclusiveMinimum, pattern and allOf is served by the T0 engine, and each
// seed's content validates against the schema (an independent validator
// is the oracle); a keyword no grammar can express (uniqueItems true) is
// a 400 naming it and its place.
func TestStructuredOutputWithConstrainedFieldsOnTheEngine(t *testing.T) {
	g := startEngineMolly(t, "tiny", 4096, "")
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(orderSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem:///order.json", v); err != nil {
		t.Fatal(err)
	}
	oracle, err := c.Compile("mem:///order.json")
	if err != nil {
		t.Fatal(err)
	}
	for seed := range 4 {
		body := fmt.Sprintf(`{"model":"chat","seed":%d,"max_tokens":600,"messages":[{"role":"user","content":"an order"}],
			"response_format":{"type":"json_schema","json_schema":{"name":"order","strict":true,"schema":%s}}}`, seed, orderSchema)
		resp, b := do(t, g, "POST", "/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Molly-Target") != "device" {
			t.Fatalf("seed %d: %d from %q: %s", seed, resp.StatusCode, resp.Header.Get("X-Molly-Target"), b)
		}
		content := gjson.GetBytes(b, "choices.0.message.content").Str
		if finish := gjson.GetBytes(b, "choices.0.finish_reason").Str; finish != "stop" {
			t.Fatalf("seed %d: finish %q: %q", seed, finish, content)
		}
		out, err := jsonschema.UnmarshalJSON(strings.NewReader(content))
		if err != nil {
			t.Fatalf("seed %d: %q is not JSON: %v", seed, content, err)
		}
		if err := oracle.Validate(out); err != nil {
			t.Errorf("seed %d: %q does not match the schema: %v", seed, content, err)
		}
	}
	resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}],
		"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":{"type":"object","properties":{"ids":{"type":"array","uniqueItems":true}}}}}}`)
	if msg := gjson.GetBytes(b, "error.message").Str; resp.StatusCode != http.StatusBadRequest || gjson.GetBytes(b, "error.param").Str != "response_format.json_schema.schema" ||
		!strings.Contains(msg, `"uniqueItems"`) || !strings.Contains(msg, `"/properties/ids/uniqueItems"`) {
		t.Fatalf("uniqueItems true: %d %s, want a 400 naming the keyword and its place", resp.StatusCode, b)
	}
}
