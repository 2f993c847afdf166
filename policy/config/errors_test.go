package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestErrorListCapped(t *testing.T) {
	var b strings.Builder
	for i := range maxErrors + 50 {
		fmt.Fprintf(&b, "k%d: 1\n", i)
	}
	_, err := noFiles.ParseYAML("t.yaml", []byte(b.String()))
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error is %T, want an ErrorList", err)
	}
	if len(list) != maxErrors+1 {
		t.Fatalf("%d errors, want %d", len(list), maxErrors+1)
	}
	if got, want := list[len(list)-1].Error(), "t.yaml:200:1: too many errors (50 more not shown)"; got != want {
		t.Errorf("last error %q, want %q", got, want)
	}
}

func TestErrorAs(t *testing.T) {
	_, err := ParsePolicyAgent("x.pa", []byte("PolicyAction a { MinRate x }"))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("errors.As found no *Error in %v", err)
	}
	if e.Pos != (Pos{File: "x.pa", Line: 1, Col: 26}) || e.Msg != `MinRate: want an integer, got "x"` {
		t.Errorf("error = %+v", e)
	}
}

func TestColumnsCountCharacters(t *testing.T) {
	_, errPA := ParsePolicyAgent("x.pa", []byte("PolicyAction é { MinRate x }"))
	_, errY := noFiles.ParseYAML("x.yaml", []byte("instance: {name: é, limits: {maxConnections: x}}"))
	for _, tt := range []struct {
		err  error
		want string
	}{
		{errPA, `x.pa:1:26: MinRate: want an integer, got "x"`},
		{errY, `x.yaml:1:46: maxConnections: want an integer, got "x"`},
	} {
		if tt.err == nil || tt.err.Error() != tt.want {
			t.Errorf("got %v, want %s", tt.err, tt.want)
		}
	}
}
