#!/usr/bin/env bash
# Times the stages of make test: how long each took on the wall clock and
# how much CPU it used, so a change to the build shows where its effect is.
#
#   stage.sh FILE init NOTE...          start a new record (NOTE: what was cached)
#   stage.sh FILE run LANE NAME CMD...  run CMD as stage NAME of LANE, record it
#   stage.sh FILE lane LANE TARGET...   make each TARGET in turn as a stage of
#                                       LANE ($MAKE), up to the first that fails
#   stage.sh FILE report                print the record as a table
#
# FILE holds one tab-separated line per stage: lane, name, start and end
# (Unix seconds), user+system CPU seconds of CMD and everything it waited
# for, and CMD's exit status. A stage that fails is recorded too.
set -euo pipefail

file=$1 verb=$2
shift 2

# cpu prints the CPU seconds (user + system) of the children in the output
# of the times builtin, which has to run in this shell, not in a subshell.
cpu() {
	awk 'NR == 2 {
		n = split($0, f, /[ \t]+/); s = 0
		for (i = 1; i <= n; i++) { if (f[i] == "") continue; split(f[i], p, /[ms]/); s += p[1] * 60 + p[2] }
		printf "%.1f", s }' "$1"
}

# clock prints seconds as m:ss.
clock() { awk -v s="$1" 'BEGIN { printf "%d:%02d", int(s / 60), int(s) % 60 }'; }

case $verb in
init)
	mkdir -p "$(dirname "$file")"
	printf '#\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" > "$file"
	;;
run)
	lane=$1 name=$2
	shift 2
	start=$(date +%s)
	rc=0
	"$@" || rc=$?
	end=$(date +%s)
	t=$(mktemp)
	times > "$t"
	used=$(cpu "$t")
	rm -f "$t"
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$lane" "$name" "$start" "$end" "$used" "$rc" >> "$file"
	exit "$rc"
	;;
lane)
	lane=$1
	shift
	for target in "$@"; do
		"$0" "$file" run "$lane" "${target##*/}" ${MAKE:-make} --no-print-directory "$target" || exit
	done
	;;
report)
	IFS=$'\t' read -r _ when note < "$file"
	first=$(awk -F'\t' '$1 != "#" { if (min == "" || $3 < min) min = $3 } END { print min }' "$file")
	echo "make test stages, started $when ($note)"
	printf '%-8s %-22s %7s %7s %7s %6s  %s\n' lane stage start wall cpu cores result
	total_cpu=0 last=$first
	while IFS=$'\t' read -r lane name start end cpu rc; do
		[[ $lane == "#" ]] && continue
		wall=$((end - start))
		cores=$(awk -v c="$cpu" -v w="$wall" 'BEGIN { printf "%.2f", (w > 0 ? c / w : 0) }')
		result=ok
		[[ $rc == 0 ]] || result="FAILED ($rc)"
		printf '%-8s %-22s %7s %7s %7s %6s  %s\n' "$lane" "$name" "$(clock $((start - first)))" "$(clock "$wall")" "$(clock "$cpu")" "$cores" "$result"
		total_cpu=$(awk -v a="$total_cpu" -v b="$cpu" 'BEGIN { print a + b }')
		((end > last)) && last=$end
	done < "$file"
	wall=$((last - first))
	echo "total: $(clock "$wall") wall, $(clock "$total_cpu") CPU ($(awk -v c="$total_cpu" -v w="$wall" 'BEGIN { printf "%.2f", (w > 0 ? c / w : 0) }') cores busy on average)"
	;;
*)
	echo "stage.sh: unknown verb $verb" >&2
	exit 2
	;;
esac
