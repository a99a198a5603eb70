package envoy

import (
	"encoding/json"
	"net"
	"os"
	"reflect"
	"strconv"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // the bootstrap's HttpProtocolOptions
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	"github.com/molly-gateway/molly/router/route"
)

// loadBootstrap reads an Envoy bootstrap YAML as Envoy does: into the v3
// Bootstrap message, unknown fields refused, then Envoy's field rules.
func loadBootstrap(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		t.Fatalf("%s is not an Envoy v3 bootstrap: %v", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

// asJSON is m in protojson with its Any fields expanded, as a value, so
// two messages compare by content, not by serialised bytes.
func asJSON(t *testing.T, m proto.Message) any {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestExampleBootstraps checks examples/envoy-fleet: both bootstraps are
// valid Envoy v3 bootstraps whose static cluster is the one the listener's
// ext_proc filter and ADS use, and the listener written out in
// envoy-static-listener.yaml is the listener Molly serves (Build).
func TestExampleBootstraps(t *testing.T) {
	const dir = "../examples/envoy-fleet/"
	for _, f := range []string{"envoy.yaml", "envoy-static-listener.yaml"} {
		b := loadBootstrap(t, dir+f)
		cs := b.GetStaticResources().GetClusters()
		if len(cs) != 1 || cs[0].GetName() != DefaultControlPlaneCluster ||
			b.GetDynamicResources().GetAdsConfig().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != DefaultControlPlaneCluster {
			t.Fatalf("%s: the static cluster must be %s, used by ADS", f, DefaultControlPlaneCluster)
		}
		if b.GetDynamicResources().GetCdsConfig().GetAds() == nil {
			t.Fatalf("%s: clusters must come over ADS", f)
		}
	}
	b := loadBootstrap(t, dir+"envoy-static-listener.yaml")
	static := b.GetStaticResources().GetListeners()
	if len(static) != 1 {
		t.Fatalf("%d static listeners, want 1", len(static))
	}
	cat := catalogue(t, &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://10.0.0.5:8000/v1", Models: []string{"chat"}})
	res, _, err := Build(cat, Config{})
	if err != nil {
		t.Fatal(err)
	}
	served := res[resource.ListenerType][0].(*listenerv3.Listener)
	if got, want := asJSON(t, static[0]), asJSON(t, served); !reflect.DeepEqual(got, want) {
		gotJS, _ := json.MarshalIndent(got, "", "  ")
		wantJS, _ := json.MarshalIndent(want, "", "  ")
		t.Fatalf("the written-out listener differs from Molly's:\n%s\nMolly serves:\n%s", gotJS, wantJS)
	}
	_, port, _ := net.SplitHostPort(DefaultListenerAddress)
	if p := static[0].GetAddress().GetSocketAddress().GetPortValue(); strconv.Itoa(int(p)) != port {
		t.Fatalf("listener port %d, want %s", p, port)
	}
}
