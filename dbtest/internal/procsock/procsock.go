// Package procsock lists the TCP connections this process holds to a given
// server port, from /proc (Linux), so that a test can pick out its own
// sessions among those a shared database server lists: the server shows each
// session's client port, and the port of a socket this process holds is
// this process's own session.
package procsock

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LocalPorts returns the local ports of this process's TCP sockets connected
// to remotePort (on any address).
func LocalPorts(remotePort int) (map[int]bool, error) {
	inodes, err := socketInodes()
	if err != nil {
		return nil, err
	}
	ports := map[int]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(table)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 {
				continue
			}
			lport, err1 := hexPort(fs[1])
			rport, err2 := hexPort(fs[2])
			if err1 != nil || err2 != nil {
				f.Close()
				return nil, fmt.Errorf("procsock: %s: bad line %q", table, sc.Text())
			}
			if rport == remotePort && inodes[fs[9]] {
				ports[lport] = true
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// socketInodes returns the inodes of the sockets among this process's file
// descriptors.
func socketInodes() (map[string]bool, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue // closed since it was listed
		}
		if rest, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(rest, "]")] = true
		}
	}
	return inodes, nil
}

// hexPort reads the port of an address as /proc/net/tcp writes it
// ("0100007F:1538").
func hexPort(addr string) (int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	p, err := strconv.ParseUint(addr[i+1:], 16, 16)
	return int(p), err
}
