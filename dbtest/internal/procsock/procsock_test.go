package procsock

import (
	"net"
	"strconv"
	"testing"
)

func TestLocalPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	server := ln.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr).Port
	ports, err := LocalPorts(server)
	if err != nil {
		t.Fatal(err)
	}
	if !ports[local] || len(ports) != 1 {
		t.Fatalf("LocalPorts(%d) = %v, want exactly {%d}", server, ports, local)
	}
	c.Close()
	ports, err = LocalPorts(server)
	if err != nil {
		t.Fatal(err)
	}
	if ports[local] {
		t.Fatalf("LocalPorts(%d) = %v still lists the closed socket's port %s", server, ports, strconv.Itoa(local))
	}
}
