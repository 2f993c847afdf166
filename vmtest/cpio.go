package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// cpio writes a "newc" (SVR4, no CRC) cpio archive, the format the Linux
// kernel unpacks as an initramfs. The kernel accepts several such archives
// concatenated, which lets the harness cache the base part (busybox and the
// kernel modules) and append the per-run part (init script, test binary).
//
// Every entry is owned by root and has mtime 0, so the same inputs give the
// same bytes. The first error sticks; later calls do nothing and close
// returns it.
type cpio struct {
	w   *bufio.Writer
	ino uint32 // next inode number; hard links are never written
	err error
}

// File-type bits of a cpio mode (from <sys/stat.h>).
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

func newCpio(w io.Writer) *cpio {
	return &cpio{w: bufio.NewWriterSize(w, 1<<16), ino: 1}
}

// header writes one entry header and its NUL-terminated, padded name.
func (c *cpio) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}
	if size > 0xffffffff {
		c.err = fmt.Errorf("vmtest: cpio: %s: %d bytes is too large for newc", name, size)
		return
	}
	name = strings.TrimPrefix(name, "/")
	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with the NUL), check.
	_, c.err = fmt.Fprintf(c.w, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%s\x00",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0, name)
	c.ino++
	c.pad(110 + int64(len(name)) + 1)
}

// pad writes zeros so that n bytes written become a multiple of 4.
func (c *cpio) pad(n int64) {
	if c.err != nil {
		return
	}
	if r := n % 4; r != 0 {
		_, c.err = c.w.Write(make([]byte, 4-r))
	}
}

// dir adds a directory. Parents must have been added first.
func (c *cpio) dir(name string) {
	c.header(name, modeDir|0o755, 0, 0, 0)
}

// bytes adds a regular file with the given contents and permission bits.
func (c *cpio) bytes(name string, perm uint32, data []byte) {
	c.header(name, modeFile|perm, int64(len(data)), 0, 0)
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	c.pad(int64(len(data)))
}

// file adds a regular file copied from the host path src, keeping its
// permission bits.
func (c *cpio) file(name, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = fmt.Errorf("vmtest: cpio: %w", err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = fmt.Errorf("vmtest: cpio: %w", err)
		return
	}
	if !st.Mode().IsRegular() {
		c.err = fmt.Errorf("vmtest: cpio: %s is not a regular file", src)
		return
	}
	c.header(name, modeFile|uint32(st.Mode().Perm()), st.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	if err == nil && n != st.Size() {
		err = fmt.Errorf("vmtest: cpio: %s changed size while being archived", src)
	}
	if err != nil {
		c.err = err
		return
	}
	c.pad(n)
}

// symlink adds a symbolic link name pointing at target.
func (c *cpio) symlink(name, target string) {
	c.header(name, modeSymlink|0o777, int64(len(target)), 0, 0)
	if c.err == nil {
		_, c.err = io.WriteString(c.w, target)
	}
	c.pad(int64(len(target)))
}

// charDev adds a character device node, such as /dev/console (5, 1), which
// the kernel opens for init before any devtmpfs is mounted.
func (c *cpio) charDev(name string, major, minor uint32) {
	c.header(name, modeCharDev|0o600, 0, major, minor)
}

// close writes the trailer entry and flushes. It does not close the
// underlying writer.
func (c *cpio) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}
