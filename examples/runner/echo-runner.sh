#!/bin/sh
# An example runner for execution hosts (`atasira serve host --runner`, `atasira dev
# --runner`): it reads its Worker's input and follows simple instructions, one per line of
# a text segment, asking its host before every tool call as an agent would.
#
#   log: TEXT      writes TEXT to the Worker's log (stderr)
#   tool: JSON     asks `atasira decide` about the tool call JSON ({"tool", "input"}) and
#                  logs the answer (this example runs no tool itself)
#   sleep: N       waits N seconds
#   result: TEXT   adds TEXT to the Worker's result (stdout)
#   fail: N        ends the Worker with exit code N
#   done           ends the Worker successfully
#
# Any other line is echoed to the result. Without `done` it waits for more input
# (POST /api/v1/workers/{id}/input) and ends when its standard input closes.
#
# To run an agent CLI instead, give the host a runner that starts it in the current
# directory (the Worker's workspace) with the context and input from stdin as its prompt,
# and have its pre-tool-use hook run `atasira decide` (exit 2 blocks the call).
set -u

unescape() {
    printf '%s\n' "$1" | sed -e 's/&quot;/"/g' -e "s/&apos;/'/g" -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&amp;/\&/g'
}

echo "runner: Worker ${ATASIRA_WORKER_ID:-?} of ${ATASIRA_BOX_TYPE:-?} started" >&2
reading=0
while IFS= read -r line; do
    case "$line" in
        "<input>") reading=1; continue ;;
        "</input>") reading=0; continue ;;
    esac
    [ "$reading" = 1 ] || continue
    line=${line#<segment kind=\"*\">}
    line=${line%</segment>}
    line=$(unescape "$line")
    case "$line" in
        log:*) echo "${line#log:}" | sed 's/^ //' >&2 ;;
        tool:*)
            call=$(echo "${line#tool:}" | sed 's/^ //')
            if answer=$(printf '%s' "$call" | atasira decide 2>&1); then
                echo "allowed: $call" >&2
            else
                echo "refused: $(echo "$answer" | tail -n 1)" >&2
            fi
            ;;
        sleep:*) sleep "$(echo "${line#sleep:}" | tr -d ' ')" ;;
        result:*) echo "${line#result:}" | sed 's/^ //' ;;
        fail:*) exit "$(echo "${line#fail:}" | tr -d ' ')" ;;
        done) exit 0 ;;
        *) echo "$line" ;;
    esac
done
exit 0
