// Package packaging holds weir's Debian package: the nfpm description
// (nfpm.yaml), the systemd unit weir@.service, the sysusers.d and
// modules-load.d files, the maintainer scripts and the example config that
// lands in /etc/weir. `make deb` runs packaging/cmd/mkdeb, which builds the
// package from them; deb_test.go builds it, inspects it with dpkg-deb,
// installs it into a throwaway root and verifies the unit there.
//
// Nothing here is imported by weir: the packager (nfpm) and the man page
// generator (cobra/doc, go-md2man) stay out of the weir binary, which
// TestWeirBinaryIsLean checks.
package packaging
