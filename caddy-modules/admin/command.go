package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/tidwall/gjson"
)

// Flags adds the flags every Molly admin command takes, resolved as Caddy's
// own commands (reload, stop) resolve the admin address: --address, else
// --config's admin listen address, else caddy.DefaultAdminListen (Molly's
// socket unless CADDY_ADMIN says otherwise).
func Flags(cmd *cobra.Command) {
	cmd.PersistentFlags().String("address", "", "admin API address, e.g. unix//run/molly/admin.sock (default: from --config, else Molly's socket)")
	cmd.PersistentFlags().StringP("config", "c", "", "config file whose admin address to use")
	cmd.PersistentFlags().StringP("adapter", "a", "", "name of the config adapter of --config")
}

// Call sends one admin API request with the address Flags resolves; body
// (if any) goes as JSON, and a JSON answer is decoded into out (if not
// nil). A status of 400 or more is an error with the endpoint's message.
func Call(c *cobra.Command, method, uri string, body, out any) error {
	address, _ := c.Flags().GetString("address")
	config, _ := c.Flags().GetString("config")
	adapter, _ := c.Flags().GetString("adapter")
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return fmt.Errorf("finding the admin API: %w", err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, nil, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, strings.SplitN(uri, "?", 2)[0], readable(err))
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, uri, err)
	}
	return nil
}

// readable shortens Caddy's "caddy responded with error: HTTP 404:
// <body>" to "HTTP 404: <message>" when the body is the OpenAI error
// object Molly's admin routes answer with; other errors are kept.
func readable(err error) error {
	s := err.Error()
	_, rest, ok := strings.Cut(s, "caddy responded with error: ")
	if !ok {
		return err
	}
	status, body, ok := strings.Cut(rest, ": ")
	if !ok {
		return err
	}
	if m := gjson.Get(body, "error.message"); m.Type == gjson.String && gjson.Get(body, "error.type").Exists() {
		return errors.New(status + ": " + m.Str)
	}
	return err
}
