package explain

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/gozt/gozt/state"
)

// Handler serves GET /debug/authz?src=..&identity=..&dst=..[&network=..]
// against the snapshot that snapshot returns at each request: 200 with the
// JSON Result, 400 for a bad query (the error names the parameter), 404 when
// no workload has the destination IP, 405 for methods other than GET and
// HEAD, 503 while snapshot returns nil. Errors are JSON {"error": "..."}.
// Mount it on the admin server (localhost only, TESTPLAN S28).
func Handler(snapshot func() *state.Snapshot) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed (use GET)")
			return
		}
		q, err := ParseQuery(r.URL.Query())
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error())
			return
		}
		snap := snapshot()
		if snap == nil {
			writeJSONError(w, http.StatusServiceUnavailable, "state not available yet")
			return
		}
		res, err := Explain(snap, q)
		if errors.Is(err, ErrNoWorkload) {
			writeJSONError(w, http.StatusNotFound, err.Error())
			return
		} else if err != nil {
			writeJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, struct {
		Error string `json:"error"`
	}{msg})
}
