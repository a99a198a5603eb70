package app

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/caddyserver/caddy/v2"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/registry/postgres"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/meter"
)

// DefaultRegistry is the registry file when the molly app names none:
// <Caddy's data directory>/molly/molly.db.
func DefaultRegistry() string { return filepath.Join(caddy.AppDataDir(), "molly", "molly.db") }

// registries holds the open registry files by absolute path, shared by the
// molly app (priors, usage delivery) and molly_auth, and across config
// reloads (the new config provisions before the old one is cleaned up).
var registries = caddy.NewUsagePool()

type pooledRegistry struct{ *registry.Registry }

func (p pooledRegistry) Destruct() error { return p.Close() }

// AcquireRegistry opens the registry file at path (absolute) or the
// PostgreSQL database of a postgres:// DSN, or takes one more reference to
// it when it is open; ReleaseRegistry gives one back and
// reports whether that closed it.
func AcquireRegistry(path string) (*registry.Registry, error) {
	v, _, err := registries.LoadOrNew(path, func() (caddy.Destructor, error) {
		r, err := registry.Open(path, registry.Options{})
		if err != nil {
			return nil, err
		}
		return pooledRegistry{r}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(pooledRegistry).Registry, nil
}

// ReleaseRegistry gives back a reference taken by AcquireRegistry.
func ReleaseRegistry(path string) (closed bool, err error) { return registries.Delete(path) }

// provisionRegistry opens the app's registry: its SQLite file, or the
// PostgreSQL database a postgres:// URL names (shared by several gateways).
func (a *App) provisionRegistry() error {
	p := a.RegistryFile
	if p == "" {
		p = DefaultRegistry()
	}
	abs := p
	if !postgres.IsDSN(p) {
		var err error
		if abs, err = filepath.Abs(p); err != nil {
			return fmt.Errorf("registry %s: %w", p, err)
		}
	}
	var err error
	if a.registry, err = AcquireRegistry(abs); err != nil {
		return fmt.Errorf("registry %s: %w", postgres.Redact(abs), err) // a DSN's password is never shown
	}
	a.registryPath = abs
	return nil
}

func (a *App) cleanupRegistry() error {
	if a.registry == nil {
		return nil
	}
	a.registry = nil
	_, err := ReleaseRegistry(a.registryPath)
	return err
}

// Registry returns the app's registry (members, keys, usage, priors), or
// nil before Provision.
func (a *App) Registry() *registry.Registry { return a.registry }

// RegistryPath returns the absolute path of the app's registry file, or
// its PostgreSQL DSN (with its password: never log it; Registry().Path()
// is the shown form).
func (a *App) RegistryPath() string { return a.registryPath }

// RegistryUsage converts a router usage record for the registry; res, when
// not 0, is the reservation it settles (keyauth.RegistryUsage).
func RegistryUsage(u meter.Usage, res int64) registry.Usage { return keyauth.RegistryUsage(u, res) }

// AnonymousMember is the member requests without molly_auth are recorded as.
const AnonymousMember = "anonymous"

// anonymousLedger records the usage of requests without molly_auth in the
// registry, as member AnonymousMember: the registry is the one book of
// record whether or not keys are in use (the usage tool is fed from it).
type anonymousLedger struct{ reg *registry.Registry }

func (l anonymousLedger) Record(ctx context.Context, u meter.Usage) error {
	u.Member = AnonymousMember
	return l.reg.Journal(ctx, RegistryUsage(u, 0)) // durable on return; in the ledger a moment later

}

// AnonymousIdentity is the identity of a request that no molly_auth
// authenticated: member "anonymous" without scopes (what the policy sees
// without an identity), its usage recorded in the registry, no budget or
// rate limit. nil before Provision.
func (a *App) AnonymousIdentity() *identity.Identity {
	return a.anonymous
}

var _ meter.Ledger = anonymousLedger{}
