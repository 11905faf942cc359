package logscope

import (
	"fmt"
	"net/http"
	"strings"
)

// usage is the help text /logging answers with on a bad request, in the
// terms of ztunnel's (SPEC §8.1), plus the `:` form istioctl sends.
func usage() string {
	return `usage: POST /logging                                (list the current levels)
usage: POST /logging?level=<level>                  (change the default level)
usage: POST /logging?level=<scope>=<level>,<level>  (change a scope's level; <scope>:<level> too)
usage: POST /logging?reset[&level=...]              (back to the start-up levels, then apply level)

hint: level: error|warn|info|debug|trace|off
hint: scope: ` + strings.Join(Scopes(), ", ") + ` (or ztunnel::<scope>)
`
}

// ServeHTTP serves the admin port's /logging as ztunnel does: POST only;
// with neither level nor reset it lists the levels; otherwise it applies
// level on top of the current levels (or the start-up ones with reset) and
// answers "current log level is <directives>". A bad level, or a scope
// gozt has no logger for (Set), is a 400 that changes nothing.
func (l *Levels) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		fmt.Fprintf(w, "invalid HTTP method\n%s", usage())
		return
	}
	q := r.URL.Query()
	level, reset := q.Get("level"), q.Has("reset")
	if level != "" || reset {
		if err := l.Set(level, reset); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, "invalid level provided: %v\n%s", err, usage())
			return
		}
	}
	fmt.Fprintf(w, "current log level is %s\n", l)
}
