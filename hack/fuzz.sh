#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the module (each `func FuzzX(f *testing.F)`
# in a _test.go file) for FUZZTIME each, one after another, and prints a table:
# target, time, result. `go test` runs only the seed corpora (testdata/fuzz);
# this is the habit that looks for new crashes.
#
# A target that fails keeps its crasher in its package's testdata/fuzz/FuzzX/,
# where `go test` replays it from then on: fix the bug, keep the file as the
# regression seed. The script goes on with the other targets and exits non-zero
# if any failed.
#
#   FUZZTIME  time per target (go test -fuzztime), default 30s
#   FUZZ      only the targets whose name matches this extended regexp
#   PKGS      only these package directories (space-separated, default all)
#   FUZZMINIMIZETIME  time to minimize each new input (go test
#             -fuzzminimizetime), default 1s: at go's default of 60s a short
#             run spends its time minimizing instead of fuzzing
set -euo pipefail

FUZZTIME="${FUZZTIME:-30s}"
FUZZ="${FUZZ:-.}"
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-1s}"
GO="${GO:-go}"
cd "$(dirname "$0")/.."

# dir<TAB>target, for every fuzz target of the chosen packages.
list_targets() {
	local dirs=(${PKGS:-.})
	grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' "${dirs[@]}" |
		sed -E 's#^(\./)?(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($#\2\t\3#' |
		sort -u | awk -F'\t' -v re="$FUZZ" '$2 ~ re'
}

targets="$(list_targets)"
if [[ -z "$targets" ]]; then
	echo "fuzz.sh: no fuzz target matches FUZZ=$FUZZ in ${PKGS:-the module}" >&2
	exit 1
fi

results=()
failed=0
while IFS=$'\t' read -r dir target; do
	echo "== $dir $target ($FUZZTIME)"
	if "$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "./$dir"; then
		results+=("$(printf '%-28s %-34s %-6s ok' "$dir" "$target" "$FUZZTIME")")
	else
		failed=$((failed + 1))
		results+=("$(printf '%-28s %-34s %-6s FAILED (crasher in %s/testdata/fuzz/%s)' "$dir" "$target" "$FUZZTIME" "$dir" "$target")")
	fi
done <<<"$targets"

echo
printf '%-28s %-34s %-6s %s\n' package target time result
printf '%s\n' "${results[@]}"
echo "$(wc -l <<<"$targets") targets, $failed failed"
[[ $failed -eq 0 ]]
