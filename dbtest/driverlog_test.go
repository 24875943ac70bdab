package dbtest

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// go-sql-driver/mysql logs what it cannot return (a connection closed under
// a read, a bad idle connection dropped) on a logger of its own, with no
// test's name beside it. driverLog names the tests whose pools were open
// when the line came, so that a line in a failed run's output says whose it
// is; Engine.OpenDSN registers each test (openedBy).
type driverLog struct{}

var openTests struct {
	sync.Mutex
	pools map[string]int // test name → pools it has open
}

func init() {
	openTests.pools = map[string]int{}
	if err := mysql.SetLogger(driverLog{}); err != nil {
		panic(err)
	}
}

// openedBy counts a pool of t's until t ends.
func openedBy(t testing.TB) {
	name := t.Name()
	openTests.Lock()
	openTests.pools[name]++
	openTests.Unlock()
	t.Cleanup(func() {
		openTests.Lock()
		defer openTests.Unlock()
		if openTests.pools[name]--; openTests.pools[name] <= 0 {
			delete(openTests.pools, name)
		}
	})
}

// during returns the tests with a pool open, for a driver's log line.
func during() string {
	openTests.Lock()
	defer openTests.Unlock()
	names := make([]string, 0, len(openTests.pools))
	for n := range openTests.pools {
		names = append(names, n)
	}
	if len(names) == 0 {
		return "no test"
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (driverLog) Print(v ...any) {
	fmt.Fprintf(os.Stderr, "[go-sql-driver/mysql, during %s] %s\n", during(), strings.TrimSuffix(fmt.Sprint(v...), "\n"))
}

// TestDriverLogNamesTests: a driver's log line names the tests whose pools
// are open.
func TestDriverLogNamesTests(t *testing.T) {
	t.Run("inner", func(t *testing.T) {
		openedBy(t)
		if got := during(); !strings.Contains(got, "TestDriverLogNamesTests/inner") {
			t.Errorf("during() = %q, want the open test's name", got)
		}
	})
	if got := during(); strings.Contains(got, "TestDriverLogNamesTests/inner") {
		t.Errorf("during() = %q after the test ended", got)
	}
}
