package translate

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
)

// APIAnthropicModels is Anthropic's Models API (GET /v1/models and
// GET /v1/models/{model_id}, https://docs.anthropic.com/en/api/models):
// the path OpenAI's models endpoint has, told apart by the
// anthropic-version header Anthropic's clients send with every request
// (AnthropicClient). The pipeline lists or retrieves models in OpenAI's
// shape; a Writer for this API writes them in Anthropic's.
const APIAnthropicModels API = "anthropic-models"

// AnthropicClient reports whether r comes from an Anthropic client: it
// carries the anthropic-version header Anthropic's API requires.
func AnthropicClient(r *http.Request) bool {
	return r.Header.Get("Anthropic-Version") != ""
}

// NewModelsWriter wraps w for a models request of an Anthropic client
// (APIAnthropicModels) with the request's query, whose limit (1 to 1000,
// default 20), after_id and before_id page a listing as Anthropic's do.
func NewModelsWriter(w http.ResponseWriter, query url.Values) *Writer {
	return &Writer{w: w, api: APIAnthropicModels, query: query}
}

// anthropicModel is Anthropic's ModelInfo for an OpenAI model object m:
// type "model", its id, the id as display_name, and created_at as an RFC
// 3339 time (the epoch when the release date is unknown, as Anthropic's
// reference allows; Molly's listing has created 0).
func anthropicModel(m gjson.Result) map[string]any {
	return map[string]any{"type": "model", "id": m.Get("id").Str, "display_name": m.Get("id").Str,
		"created_at": time.Unix(m.Get("created").Int(), 0).UTC().Format(time.RFC3339)}
}

// anthropicModels translates a models answer (an OpenAI list or model
// object) into Anthropic's: {"data": [ModelInfo…], "has_more", "first_id",
// "last_id"} for a list, paged by query (after_id: the models after that
// id, before_id: the limit models before it, has_more whether more lie
// in the direction paged), or one ModelInfo. A limit out of range is a
// 400, as on Anthropic's API.
func anthropicModels(body []byte, query url.Values, requestID string) (int, []byte) {
	root := gjson.ParseBytes(body)
	if root.Get("object").Str != "list" {
		return http.StatusOK, marshal(anthropicModel(root))
	}
	limit := 20
	if v := query.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return http.StatusBadRequest, messageError(http.StatusBadRequest,
				[]byte(`{"error":{"message":"limit: Input should be an integer from 1 to 1000."}}`), false, requestID)
		}
		limit = n
	}
	all := root.Get("data").Array()
	ids := make([]string, len(all))
	for i, m := range all {
		ids[i] = m.Get("id").Str
	}
	lo, hi := 0, len(all)
	more := false
	if b := query.Get("before_id"); b != "" {
		hi = max(slices.Index(ids, b), 0)
		lo = max(hi-limit, 0)
		more = lo > 0
	} else {
		if a := query.Get("after_id"); a != "" {
			if i := slices.Index(ids, a); i >= 0 {
				lo = i + 1
			} else {
				lo = len(all)
			}
		}
		hi = min(lo+limit, len(all))
		more = hi < len(all)
	}
	data := []any{}
	for _, m := range all[lo:hi] {
		data = append(data, anthropicModel(m))
	}
	page := map[string]any{"data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if lo < hi {
		page["first_id"], page["last_id"] = ids[lo], ids[hi-1]
	}
	return http.StatusOK, marshal(page)
}
