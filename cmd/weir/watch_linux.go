package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// fileWatch follows one file through inotify on its directory (a rename
// into place replaces the file's inode: a watch on the file itself would
// lose it): Closed gets a value when a writer of the file closed it
// (IN_CLOSE_WRITE) or a file was renamed onto its name (IN_MOVED_TO), the
// moments its content is whole; Writing reports a file modified since.
type fileWatch struct {
	name    string
	f       *os.File
	closed  chan struct{} // buffered 1: the events coalesce
	writing atomic.Bool
	wg      sync.WaitGroup
}

// watchFile starts watching path; it fails where inotify is unavailable
// (the reloader then keeps its settle rule).
func watchFile(path string) (*fileWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	dir := filepath.Dir(path)
	const mask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_CREATE
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify on %s: %w", dir, err)
	}
	// A non-blocking descriptor goes through Go's poller: Close ends a
	// Read in progress.
	w := &fileWatch{name: filepath.Base(path), f: os.NewFile(uintptr(fd), "inotify"), closed: make(chan struct{}, 1)}
	w.wg.Add(1)
	go w.run()
	return w, nil
}

// Closed gets a value after each writer's close of the file, or a rename
// onto it (or an event queue overflow: look again).
func (w *fileWatch) Closed() <-chan struct{} { return w.closed }

// Writing reports that the file was modified (or created) and not closed by
// its writer since: its content may be a prefix.
func (w *fileWatch) Writing() bool { return w.writing.Load() }

// Close stops the watch and waits for its goroutine.
func (w *fileWatch) Close() error {
	err := w.f.Close()
	w.wg.Wait()
	return err
}

func (w *fileWatch) run() {
	defer w.wg.Done()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.signal() // lost: let the reloader look
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			off = start + nameLen
			if off > n {
				break
			}
			if mask&unix.IN_Q_OVERFLOW != 0 {
				w.signal()
				continue
			}
			name := buf[start:off]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			if string(name) != w.name {
				continue
			}
			switch {
			case mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0:
				w.writing.Store(false)
				w.signal()
			case mask&(unix.IN_MODIFY|unix.IN_CREATE) != 0:
				w.writing.Store(true)
			}
		}
	}
}

func (w *fileWatch) signal() {
	select {
	case w.closed <- struct{}{}:
	default:
	}
}
