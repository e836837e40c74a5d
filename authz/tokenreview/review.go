package tokenreview

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/workload-ca/workload-ca/authz"
)

// User extra keys the apiserver sets for pod-bound service account tokens.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

const serviceAccountPrefix = "system:serviceaccount:"

// review makes one TokenReview call. result is one of the Result* values;
// err wraps authz.ErrUnavailable for API failures and
// authz.ErrUnauthenticated for rejections.
func (r *Reviewer) review(ctx context.Context, token string) (c authz.Caller, saUID, result string, err error) {
	req := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: r.audiences}}
	resp, err := r.client.Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return authz.Caller{}, "", ResultError, fmt.Errorf("%w: token review: %w", authz.ErrUnavailable, redact(err, token))
	}
	c, result, err = callerFromStatus(resp.Status, r.audiences)
	if err != nil {
		return authz.Caller{}, "", result, fmt.Errorf("%w: %w", authz.ErrUnauthenticated, err)
	}
	if result, err := r.checkPod(ctx, c); err != nil {
		return authz.Caller{}, "", result, err
	}
	c.ExpiresAt, _ = tokenExpiry(token)
	return c, resp.Status.User.UID, ResultAuthenticated, nil
}

// checkPod rejects a pod-bound token whose pod no longer exists, which the
// apiserver's own cache of successful token checks can hide for seconds.
func (r *Reviewer) checkPod(ctx context.Context, c authz.Caller) (string, error) {
	if c.PodUID == "" || r.pods == nil {
		return ResultAuthenticated, nil
	}
	_, found, err := r.pods.Pod(ctx, c.Namespace, c.PodName, c.PodUID)
	switch {
	case err != nil:
		return ResultError, fmt.Errorf("%w: checking the token's pod %s/%s: %w", authz.ErrUnavailable, c.Namespace, c.PodName, err)
	case !found:
		return ResultPodGone, fmt.Errorf("%w: the token's pod %s/%s (uid %s) no longer exists",
			authz.ErrUnauthenticated, c.Namespace, c.PodName, c.PodUID)
	}
	return ResultAuthenticated, nil
}

// callerFromStatus checks a TokenReview status and extracts the caller.
// audiences are the ones we asked for; when set, the status must confirm one.
func callerFromStatus(st authnv1.TokenReviewStatus, audiences []string) (authz.Caller, string, error) {
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "no reason given"
		}
		return authz.Caller{}, ResultNotAuthenticated, fmt.Errorf("token not authenticated: %s", reason)
	}
	confirmed := func(a string) bool { return slices.Contains(audiences, a) }
	if len(audiences) > 0 && !slices.ContainsFunc(st.Audiences, confirmed) {
		return authz.Caller{}, ResultAudienceMismatch,
			fmt.Errorf("token audiences %q include none of %q", st.Audiences, audiences)
	}
	ns, sa, err := splitServiceAccount(st.User.Username)
	if err != nil {
		return authz.Caller{}, ResultNotServiceAccount, err
	}
	c := authz.Caller{Namespace: ns, ServiceAccount: sa}
	if err := setBinding(&c, st.User.Extra); err != nil {
		return authz.Caller{}, ResultInvalidUserInfo, err
	}
	return c, ResultAuthenticated, nil
}

// splitServiceAccount parses system:serviceaccount:<namespace>:<name>.
func splitServiceAccount(username string) (ns, sa string, err error) {
	rest, ok := strings.CutPrefix(username, serviceAccountPrefix)
	if !ok {
		return "", "", fmt.Errorf("username %q is not a service account", username)
	}
	ns, sa, ok = strings.Cut(rest, ":")
	if !ok || strings.Contains(sa, ":") {
		return "", "", fmt.Errorf("username %q: want %s<namespace>:<name>", username, serviceAccountPrefix)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", fmt.Errorf("username %q: invalid namespace: %s", username, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
		return "", "", fmt.Errorf("username %q: invalid service account name: %s", username, strings.Join(errs, "; "))
	}
	return ns, sa, nil
}

// setBinding copies the pod and node the token is bound to from user extra,
// where each is a one-item list.
func setBinding(c *authz.Caller, extra map[string]authnv1.ExtraValue) error {
	fields := []struct {
		key string
		dst *string
	}{{extraPodName, &c.PodName}, {extraPodUID, &c.PodUID}, {extraNodeName, &c.NodeName}}
	for _, f := range fields {
		switch v := extra[f.key]; len(v) {
		case 0:
		case 1:
			*f.dst = v[0]
		default:
			return fmt.Errorf("user extra %s has %d values, want 1", f.key, len(v))
		}
	}
	if (c.PodName == "") != (c.PodUID == "") {
		return fmt.Errorf("user extra has pod name %q but pod uid %q", c.PodName, c.PodUID)
	}
	return nil
}

// redactedError keeps the chain of an API error (for errors.Is/As) while
// making sure its text cannot carry the token, whatever the transport puts
// into error messages.
type redactedError struct {
	msg string
	err error
}

func redact(err error, token string) error {
	return &redactedError{msg: strings.ReplaceAll(err.Error(), token, "<token>"), err: err}
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// reviewAndStore makes the API call, reports it and caches its answer,
// bound to the key that verified the token (keyID, "" if none did). API
// errors are returned, not cached.
func (r *Reviewer) reviewAndStore(ctx context.Context, key [sha256.Size]byte, token, keyID string) (*entry, error) {
	if e, ok := r.cached(key); ok {
		return e, nil // answered while this review was queued
	}
	start := r.clock.Now()
	c, saUID, result, err := r.review(ctx, token)
	r.obs.ReviewDone(result, r.clock.Since(start))
	r.logReview(ctx, key, result, c, err)
	if result == ResultError {
		return nil, err
	}
	e := &entry{caller: c, err: err, bound: binding{saUID: saUID, keyID: keyID}}
	r.store(key, e)
	return e, nil
}

func (r *Reviewer) logReview(ctx context.Context, key [sha256.Size]byte, result string, c authz.Caller, err error) {
	if !r.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{
		slog.String("token_sha256", hex.EncodeToString(key[:6])),
		slog.String("result", result),
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	} else {
		attrs = append(attrs, slog.String("caller", c.String()), slog.String("node", c.NodeName),
			slog.Time("expires", c.ExpiresAt))
	}
	r.log.LogAttrs(ctx, slog.LevelDebug, "token reviewed", attrs...)
}
