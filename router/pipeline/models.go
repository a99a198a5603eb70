package pipeline

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/molly-gateway/molly/router/openai"
)

// models answers GET /v1/models (the models of the targets the decision
// allows, as far as the caller's model scope admits them: the policy's
// "models" list) and GET /v1/models/{model}.
func (p *Pipeline) models(rq *request) error {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	visible, scoped := rq.dec.Models()
	for _, m := range p.Catalogue.Models(rq.dec) {
		if scoped && !slices.Contains(visible, m) {
			continue
		}
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "molly"})
	}
	var v any = list
	if one := rq.a.Model(); one != "" { // GET /v1/models/{model}
		i := slices.IndexFunc(list.Data, func(m model) bool { return m.ID == one })
		if i < 0 {
			return &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
				Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", one)}
		}
		v = list.Data[i]
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	rq.w.Header().Set("Content-Type", "application/json")
	rq.w.WriteHeader(http.StatusOK)
	_, _ = rq.w.Write(b)
	return nil
}
