// Package vmtest is weir's QEMU harness: it boots a Linux kernel with weir
// inside and runs the end-to-end scenarios there, where netem gives real loss
// and delay. It uses only the standard library and the built binary.
package vmtest
