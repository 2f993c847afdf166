// Package http is the request-by-request proxy of weir's http virtual
// servers: a proxy.RequestServer (Server) that reads each request head
// with net/http's parser under weir's own bounds, admits it through its
// Options.RequestAdmitter, sends it to a target connection from its pool
// (pool.go) or a fresh one, and relays the response, reporting every
// request's bytes and end to its session. A client's fault (a bad or slow
// body) is never the target's (body.go).
//
// It imports no gVisor: the client connection is a proxy.Client and the
// target connections are proxy.Targets, dialed and measured by the proxy.
// Importers name it proxyhttp beside net/http.
package http
