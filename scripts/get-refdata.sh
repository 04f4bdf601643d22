#!/usr/bin/env bash
# Put the third-party reference data where llm-sweep looks for it, checked file by file.
#   get-refdata.sh --from DIR [--dest DIR]   copy every file listed in data/README.md from DIR
#   get-refdata.sh --check [--dest DIR]      verify the files already in place
# The destination is --dest, else $SWEEP_REFDATA, else data/refdata/ in the checkout (git-ignored).
# Each file must match the sha256 in data/README.md; a missing or different file is an error that
# names it, and nothing half-copied is left behind (each file is copied to a temp name, checked,
# then renamed).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
manifest=$repo/data/README.md
src="" dest=${SWEEP_REFDATA:-$repo/data/refdata} mode=""
usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --from) [[ $# -ge 2 ]] || usage; src=$2 mode=copy; shift 2 ;;
    --dest) [[ $# -ge 2 ]] || usage; dest=$2; shift 2 ;;
    --check) mode=check; shift ;;
    -h|--help) usage ;;
    *) echo "get-refdata.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n $mode ]] || usage
if [[ $mode == copy && ! -d $src ]]; then
  echo "get-refdata.sh: --from $src is not a folder" >&2; exit 2
fi

# "| `name` | `sha256` | origin | licence |" rows of data/README.md
mapfile -t entries < <(sed -n 's/^| `\([^`]*\)` | `\([0-9a-f]\{64\}\)` |.*/\2 \1/p' "$manifest")
if [[ ${#entries[@]} -eq 0 ]]; then
  echo "get-refdata.sh: no files listed in $manifest" >&2; exit 1
fi

failed=0
for entry in "${entries[@]}"; do
  want=${entry%% *} name=${entry#* }
  target=$dest/$name
  if [[ $mode == copy ]]; then
    if [[ ! -f $src/$name ]]; then
      echo "get-refdata.sh: $src/$name is missing" >&2; failed=1; continue
    fi
    mkdir -p "$(dirname "$target")"
    tmp=$(mktemp "$target.XXXXXX")
    cp "$src/$name" "$tmp"
    chmod 0644 "$tmp"
  else
    tmp=$target
    if [[ ! -f $tmp ]]; then
      echo "get-refdata.sh: $target is missing" >&2; failed=1; continue
    fi
  fi
  got=$(sha256sum "$tmp" | cut -c1-64)
  if [[ $got != "$want" ]]; then
    echo "get-refdata.sh: $name has sha256 $got, data/README.md lists $want: not the published file" >&2
    [[ $mode == copy ]] && rm -f "$tmp"
    failed=1; continue
  fi
  [[ $mode == copy ]] && mv -f "$tmp" "$target"
done
if [[ $failed -ne 0 ]]; then
  echo "get-refdata.sh: some files are missing or differ (above); $dest is incomplete" >&2
  exit 1
fi
echo "get-refdata.sh: ${#entries[@]} files in $dest match data/README.md"
