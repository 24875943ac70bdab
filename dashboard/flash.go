package dashboard

import (
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// returnPages are the pages a form's return field may name: the
// dashboard's own, relative to where it is mounted.
var returnPages = map[string]bool{"./": true, "jobs": true, "job": true}

// localReturn checks a form's return field, the page to go back to after
// the action: one of the dashboard's pages as a relative path (./?queue=…,
// jobs?…, job?…), rebuilt from its parts, so that a crafted form cannot
// send the operator to another host (//evil.com, http://evil.com) or out
// of the prefix the dashboard is mounted under (/elsewhere).
func localReturn(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	u, err := url.Parse(s)
	if err != nil || len(s) > 2048 || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		strings.ContainsAny(s, "\\\x00\t\r\n") || !returnPages[u.Path] {
		return "", fmt.Errorf("return %q is not a page of this dashboard (./, jobs or job)", short(s, 64))
	}
	if q := u.Query(); len(q) > 0 {
		return u.Path + "?" + q.Encode(), nil
	}
	return u.Path, nil
}

// flashCookie carries the result of an action across the redirect to the
// return page, which shows it once.
const flashCookie = "inbox_dashboard_flash"

// maxFlash bounds the text a flash carries, to keep the cookie small.
const maxFlash = 1000

// goBack answers a form's action with res: a redirect to ret (see
// localReturn), leaving res for the page there to show once. An action
// refused (read-only, no token) or with nowhere to go answers here, on
// the main page, with its status. ret is relative: the browser resolves
// it against the action's URL, under whatever prefix the dashboard is
// mounted.
func (h *Handler) goBack(w http.ResponseWriter, r *http.Request, ret string, res result) {
	if ret == "" || strings.HasPrefix(res.Text, "refused:") {
		h.servePage(w, r, &res)
		return
	}
	ok := "0"
	if res.OK {
		ok = "1"
	}
	v := base64.RawURLEncoding.EncodeToString([]byte(ok + short(res.Text, maxFlash)))
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: v + "." + h.sign("flash:"+v), Path: h.cookie, MaxAge: 60,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.Header().Set("Location", ret)
	w.WriteHeader(http.StatusSeeOther)
}

// flash returns the result an action left for this page, and clears it;
// nil when there is none or it is not one of this handler's.
func (h *Handler) flash(w http.ResponseWriter, r *http.Request) *result {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: h.cookie, MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	res, err := h.readFlash(c.Value)
	if err != nil {
		return nil
	}
	return res
}

func (h *Handler) readFlash(value string) (*result, error) {
	v, sig, found := strings.Cut(value, ".")
	if !found || !hmac.Equal([]byte(sig), []byte(h.sign("flash:"+v))) {
		return nil, errors.New("not signed by this handler")
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) == 0 {
		return nil, errors.New("not a flash")
	}
	return &result{OK: b[0] == '1', Text: string(b[1:])}, nil
}
