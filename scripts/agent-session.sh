#!/bin/sh
# Plays an agent's first session against a ctxfs mount and prints the
# transcript that docs/AGENTS.md shows (a mount test keeps the two equal).
# Usage: scripts/agent-session.sh MOUNT   (as a writer of account "acme")
set -u
cd "$1" || exit 1

# Setup, not part of the transcript: what earlier sessions remembered.
mem() {
    N=accounts/acme/users/alice/memories/$1
    mkdir -p "$N" && printf '%b' "$2" > "$N/content.md" && echo '[]' > "$N/.relations.json" &&
        /bin/echo '{"status":"ACTIVE"}' > "$N/.meta.json" || exit 1
}
mem prefs/editor '# Editor\n\nAlice edits code in Helix with the default keymap.\n\n## Plugins\nShe uses no plugins; the built-in LSP client is enough.\n'
mem prefs/tea '# Tea\n\nAlice drinks sencha in the morning and no coffee after noon.\n'
mem projects/ctxfs '# ctxfs\n\nAlice maintains ctxfs, a FUSE file system for agent memory.\n\n## Release\nReleases go out on Tuesdays after the crash torture passes.\n'
cat .ctxfs/sync > /dev/null

# The session. Each command is shown with its output.
run() {
    printf '$ %s\n' "$1"
    sh -c "$1" 2>&1 || printf '(exit status %s)\n' "$?"
}
A=accounts/acme/users/alice
run "cat .ctxfs/header"
run "cat $A/README.md"
run "cat '$A/.search/which editor does alice use'"
run "cat $A/memories/prefs/editor/.abstract.md"
run "sed -n '5,6p' $A/memories/prefs/editor/content.md"
run "N=$A/memories/prefs/shell; mkdir -p \$N && printf 'Alice uses fish as her login shell.\\n' > \$N/content.md && echo '[]' > \$N/.relations.json && /bin/echo '{\"status\":\"ACTIVE\",\"tags\":[\"shell\"]}' > \$N/.meta.json"
run "cat $A/memories/prefs/shell/.meta.json"
run "cat .ctxfs/sync"
run "cat '$A/.search/what shell does she use?k=2'"
run "cat '$A/.search/quantum chromodynamics?format=json' | grep -E '\"(answerable|signal)\"'"
run "mkdir -p $A/memories/prefs/broken && /bin/echo '{\"status\":\"ACTIVE\"}' > $A/memories/prefs/broken/.meta.json"
run "cat $A/memories/prefs/broken/.commit-error"
