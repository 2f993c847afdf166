package config

import (
	"fmt"
	"sort"
	"strings"
)

// Pos is a position in a config file: 1-based line and column, the column
// counting characters. Line 0 means the file as a whole.
type Pos struct {
	File string
	Line int
	Col  int
}

// String returns "file:line:col".
func (p Pos) String() string {
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
}

// Error is one problem in a config file, at a position.
type Error struct {
	Pos
	Msg string // one line, without the position
}

// Error returns "file:line:col: reason".
func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

// ErrorList is every problem found in a config, in file order and then by
// position. Parsers return it (as an error) when it is not empty.
type ErrorList []*Error

// Error prints one error per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the errors, so errors.As finds an *Error in the list.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// maxErrors bounds the errors one parse collects, so that a huge broken input
// cannot produce a huge report; the last entry then says how many were dropped.
const maxErrors = 200

// errs collects errors with the order in which files were first seen.
type errs struct {
	list    ErrorList
	dropped int
	files   map[string]int
}

// file records the order of files: their errors are listed in this order.
func (e *errs) file(name string) {
	if e.files == nil {
		e.files = map[string]int{}
	}
	if _, ok := e.files[name]; !ok {
		e.files[name] = len(e.files)
	}
}

func (e *errs) add(p Pos, format string, args ...any) {
	if len(e.list) >= maxErrors {
		e.dropped++
		return
	}
	e.force(p, format, args...)
}

// force adds an error even past maxErrors: for the one that explains why
// parsing stopped.
func (e *errs) force(p Pos, format string, args ...any) {
	e.file(p.File)
	e.list = append(e.list, &Error{Pos: p, Msg: fmt.Sprintf(format, args...)})
}

// err returns the sorted list, or nil when there is none.
func (e *errs) err() error {
	if len(e.list) == 0 {
		return nil
	}
	l := e.list
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return e.files[a.File] < e.files[b.File]
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	if e.dropped > 0 {
		last := l[len(l)-1]
		l = append(l, &Error{Pos: last.Pos, Msg: fmt.Sprintf("too many errors (%d more not shown)", e.dropped)})
	}
	return l
}
