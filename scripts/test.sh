#!/usr/bin/env bash
# The test command: sets up everything the tests need on a fresh machine, then runs them.
#   1. the virtualenv with llm-sweep, torch (CPU wheel) and pytest   (scripts/setup-env.sh)
#   2. shellcheck, to lint rendered sbatch scripts                     (Debian package)
#      Chromium and chromedriver, to open the report's index.html       (Debian packages)
#   3. a real Slurm cluster: munge, MariaDB+slurmdbd, slurmctld, 4 slurmd (scripts/local-slurm.sh)
# Then pytest over tests/, in one process. SWEEP_TEST_WORKERS=N runs N pytest-xdist workers
# instead (a file's tests stay on one worker, the live-Slurm tests run one at a time, and a test
# marked `alone` runs with no other: tests/conftest.py); on 2 cores that is no faster
# (docs/contributing.md, "Parallel runs"). Extra arguments go to pytest
# (e.g. -k watchdog, -m "not slow"). SWEEP_TEST_CPU_TOP=N ends the run with the N tests that kept
# the cores busiest (docs/contributing.md).
# SWEEP_NO_SLURM=1 skips step 3 (the Slurm tests then skip instead of failing).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

bash scripts/setup-env.sh

if ! command -v shellcheck >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 shellcheck) >/dev/null
  else
    echo "test.sh: shellcheck is missing and this is not root: install it (apt-get install shellcheck)" >&2
  fi
fi

# A real browser for report/index.html (tests/analysis/test_report_browser.py, driven by Selenium).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 chromium chromium-driver) >/dev/null
  else
    echo "test.sh: chromium is missing and this is not root: install it (apt-get install chromium chromium-driver)" >&2
  fi
fi

# The frameworks' own parsers and validators, pinned, for the contract tests (-m contract):
# each script installs one framework's versions under .contract/ (idempotent).
for script in scripts/contract/*.sh; do
  [[ -e $script ]] && bash "$script"
done

if [[ "${SWEEP_NO_SLURM:-0}" != 1 ]]; then
  bash scripts/local-slurm.sh start
  export SWEEP_REQUIRE_SLURM=1
fi

set +e
workers=()
if [[ "${SWEEP_TEST_WORKERS:-0}" != 0 ]]; then
  workers=(-n "$SWEEP_TEST_WORKERS" --dist loadgroup)
fi
.venv/bin/python -m pytest "${workers[@]}" "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit $status
