package config

import (
	"strings"
	"testing"

	"weir/policy"
)

func TestParseHashBy(t *testing.T) {
	text := `
balancer: {algorithm: maglev, hashBy: "header:x-user"}
services:
  - {name: web, protocol: http, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}
  - {name: shop, protocol: http, hashBy: "cookie:session", vips: [198.18.0.1], port: 81, targets: [{address: 198.18.1.1:80}]}
  - {name: ssh, vips: [198.18.0.1], port: 22, targets: [{address: 198.18.1.1:22}]}
  - {name: db, hashBy: connection, vips: [198.18.0.1], port: 5432, targets: [{address: 198.18.1.1:5432}]}
`
	c, err := noFiles.ParseYAML("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]policy.HashBy{
		"web":  {Kind: policy.HashHeader, Name: "X-User"},
		"shop": {Kind: policy.HashCookie, Name: "session"},
		"ssh":  {Kind: policy.HashClient}, // a tcp service has no headers
		"db":   {},
	} {
		if got := c.ServiceByName(name).HashBy; got == nil || *got != want {
			t.Errorf("%s: hashBy %v, want %v", name, got, want)
		}
	}
	c, err = noFiles.ParseYAML("t.yaml", []byte("services:\n  - {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.ServiceByName("a").HashBy; h == nil || *h != (policy.HashBy{}) || h.String() != "connection" {
		t.Errorf("default hashBy %v, want connection", h)
	}
}

func TestParseHashByErrors(t *testing.T) {
	svc := func(proto, by string) string {
		return "balancer: {algorithm: maglev}\nservices:\n  - {name: a, protocol: " + proto + ", hashBy: \"" + by + "\", vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n"
	}
	for _, tt := range []struct{ name, text, want string }{
		{"unknown", "balancer: {algorithm: maglev, hashBy: source}\n", `hashBy: hashBy "source": want connection, client, header:NAME or cookie:NAME`},
		{"empty name", "balancer: {algorithm: maglev, hashBy: \"header:\"}\n", `hashBy "header:": want connection`},
		{"bad header name", "balancer: {algorithm: maglev, hashBy: \"header:x user\"}\n", `hashBy "header:x user": want connection`},
		{"not maglev", "balancer: {hashBy: client}\n", "balancer hashBy client needs algorithm maglev, not round-robin"},
		{"header on tcp", svc("tcp", "header:X-User"), `virtual server "a": hashBy header:X-User needs protocol http`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}
