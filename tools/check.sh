#!/usr/bin/env bash
# make check: the inner loop. Lints and tests what changed since BASE (a
# branch or commit; the merge base with it is used), committed or not:
#
#   - go vet over the module (cached, so only what changed and what imports
#     it is vetted again), golangci-lint over the changed packages, and buf,
#     the tidy check, govulncheck, the chart and the configuration reference
#     only when what they check changed;
#   - the unit tests of the changed packages (race detector on; all of them
#     when go.mod changed);
#   - their tests against the real apiserver (TestE2E*), the e2e suite's
#     tests defined in changed e2e/*_test.go files, the tests of changed
#     packages under e2e/, and all of the suite (and every package's
#     TestE2E*) when a helper file of the e2e package or a harness
#     (e2e/controlplane, e2e/internal, e2e/cahost) changed.
#
# make test runs everything; make check is what a change most likely broke.
# The Makefile exports the e2e suite's environment, GO, MAKE and BIN, and
# its lists of unit-test packages (UNIT_PKGS) and of packages with tests
# against the real apiserver (E2E_PKGS).
set -euo pipefail

base=${1:-main}
GO=${GO:-go} MAKE=${MAKE:-make} BIN=${BIN:-bin}
started=$(date +%s)

since=$(git merge-base HEAD "$base") || {
	echo "make check: no merge base with $base; set CHECK_BASE to a branch or commit" >&2
	exit 2
}
# Both sides of a rename; a deleted file's package, if it is still there.
mapfile -t changed < <({ git diff --name-only --no-renames "$since"; git ls-files --others --exclude-standard; } | sort -u)
if ((${#changed[@]} == 0)); then
	echo "make check: nothing changed since $base ($since)"
	exit 0
fi

# Directories of the other modules (tools and e2e dependencies): their files
# are not the product's packages.
mapfile -t modules < <(git ls-files '*go.mod' | xargs -n1 dirname | grep -vx '.')
in_other_module() {
	local m
	for m in "${modules[@]}"; do [[ $1 == "$m"/* ]] && return 0; done
	return 1
}

declare -A dirs=()
e2e_tests=() e2e_whole=false all_units=false vulngate=false
lint_proto=false lint_chart=false lint_mod=false lint_vuln=false lint_config=false
for f in "${changed[@]}"; do
	case $f in
	proto/*) lint_proto=true ;;
	deploy/charts/*) lint_chart=true ;;
	go.mod | go.sum) lint_mod=true lint_vuln=true all_units=true ;;
	tools/vuln/*.go) vulngate=true ;;
	*/go.mod | */go.sum) lint_mod=true ;;
	esac
	[[ $f == cmd/workload-ca/* ]] && lint_config=true
	[[ $f == *.go && -d $(dirname "$f") ]] || continue
	in_other_module "$f" && continue
	dir=$(dirname "$f")
	# The suite's harnesses: every test against the real apiserver uses them.
	case $dir in e2e/controlplane* | e2e/internal/* | e2e/cahost*) e2e_whole=true ;; esac
	if [[ $dir == e2e ]]; then
		mapfile -t tests < <(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing\.T) {$/\1/p' "$f")
		if ((${#tests[@]} == 0)); then e2e_whole=true; else e2e_tests+=("${tests[@]}"); fi
		continue
	fi
	dirs[./$dir]=1
done

pkgs=() e2e_pkgs=() e2e_dirs=()
for d in "${!dirs[@]}"; do
	if [[ $d == ./e2e/* ]]; then
		e2e_dirs+=("$d")
		continue
	fi
	pkgs+=("$d")
	[[ " $(echo $E2E_PKGS) " == *" $d "* ]] && e2e_pkgs+=("$d")
done
# A harness of the suite changed: every package's tests against the real
# apiserver too.
if $e2e_whole; then mapfile -t e2e_pkgs <<< "$E2E_PKGS"; fi

# The e2e package's own tests run: some or (a helper or harness changed) all.
e2e_suite=false
if $e2e_whole || ((${#e2e_tests[@]} > 0)); then e2e_suite=true; fi

step() { echo "== make check: $*"; }

step "lint"
$GO vet ./...
lint_dirs=("${pkgs[@]}" "${e2e_dirs[@]}")
$e2e_suite && lint_dirs+=(./e2e)
if ((${#lint_dirs[@]} > 0)); then "$BIN"/golangci-lint run "${lint_dirs[@]}"; fi
if $lint_proto; then
	(cd proto && "$BIN"/buf lint)
	$MAKE --no-print-directory generate-check
fi
if $lint_chart; then $MAKE --no-print-directory chart-lint; fi
if $lint_mod; then $MAKE --no-print-directory tidy-check; fi
if $lint_vuln; then $MAKE --no-print-directory vuln; fi
if $lint_config; then $MAKE --no-print-directory config-reference-check; fi

# The control plane's variables are set: the TestE2E* tests run in the
# next step, without the race detector, as make test runs them.
if $all_units; then mapfile -t pkgs <<< "$UNIT_PKGS"; fi
if ((${#pkgs[@]} > 0)); then
	((${#pkgs[@]} > 12)) && step "unit tests: ${#pkgs[@]} packages" || step "unit tests: ${pkgs[*]}"
	$GO test -race -tags nocloudkms -skip '^TestE2E' "${pkgs[@]}"
fi
if $vulngate; then
	step "unit tests: tools/vuln"
	(cd tools/vuln && $GO test ./...)
fi

# The control plane and the product's binary, only when a test runs them.
if ((${#e2e_pkgs[@]} + ${#e2e_dirs[@]} > 0)) || $e2e_suite; then
	$MAKE --no-print-directory controlplane build
fi
if ((${#e2e_pkgs[@]} > 0)); then
	step "tests against the real apiserver: ${e2e_pkgs[*]}"
	$GO test -count=1 -timeout 10m -run '^TestE2E' "${e2e_pkgs[@]}"
fi
if ((${#e2e_dirs[@]} > 0)); then
	step "packages under e2e/: ${e2e_dirs[*]}"
	$GO test -count=1 -timeout 20m "${e2e_dirs[@]}"
fi
if $e2e_suite; then
	$MAKE --no-print-directory e2e-deps
	if $e2e_whole; then
		step "the e2e suite (a helper or harness of it changed)"
		$GO test -count=1 -timeout 20m ./e2e/
	else
		run=$(IFS='|'; echo "${e2e_tests[*]}")
		step "e2e tests in changed files: ${e2e_tests[*]}"
		$GO test -count=1 -timeout 20m -run "^($run)\$" ./e2e/
	fi
fi

echo "make check: passed in $(($(date +%s) - started)) s (changes since $base, $since)"
