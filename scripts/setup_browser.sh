#!/usr/bin/env bash
# Who: a maintainer, through `make test` / `make screenshots` / .ci/run, before the browser tests.
# Debian's chromium for the browser tests (tests/test_browser.py drives /usr/bin/chromium, never a
# downloaded browser). `make test` and `.ci/run` run this first.
#
#   scripts/setup_browser.sh           install chromium if it is missing and this user can (root, or
#                                      sudo without a password); otherwise stop, naming the command to run
#   scripts/setup_browser.sh --check   only say what it would do: present, root, sudo or manual
#
# CHROMIUM overrides the path it looks for (the tests of this script use it).
set -euo pipefail

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
COMMAND="apt-get update -qq && apt-get install -y -qq chromium"

decide() {
    if [ -x "$CHROMIUM" ]; then
        echo present
    elif ! command -v apt-get >/dev/null 2>&1; then
        echo manual
    elif [ "$(id -u)" = 0 ]; then
        echo root
    elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        echo sudo
    else
        echo manual
    fi
}

how="$(decide)"
if [ "${1:-}" = "--check" ]; then
    echo "$how"
    exit 0
fi
case "$how" in
    present)
        exit 0 ;;
    root)
        echo "Installing Debian's chromium for the browser tests: $COMMAND"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium ;;
    sudo)
        echo "Installing Debian's chromium for the browser tests: sudo $COMMAND"
        sudo -n apt-get update -qq
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium ;;
    manual)
        if command -v apt-get >/dev/null 2>&1; then
            run="sudo sh -c '$COMMAND'"
        else
            run="your system's package for chromium, at $CHROMIUM"
        fi
        echo "The browser tests need Debian's chromium at $CHROMIUM, and this user cannot install it." >&2
        echo "Install it once, then run make test again:" >&2
        echo "    $run" >&2
        exit 1 ;;
esac
if [ ! -x "$CHROMIUM" ]; then
    echo "chromium was installed but $CHROMIUM is still missing" >&2
    exit 1
fi
