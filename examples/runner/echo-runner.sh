#!/bin/sh
# An example runner for execution hosts (`atasira serve host --runner`, `atasira dev
# --runner`): it reads its Worker's input and follows simple instructions, one per line of
# a text segment, asking its host before every tool call as an agent would.
#
#   log: TEXT      writes TEXT to the Worker's log (stderr)
#   tool: JSON     asks `atasira decide` about the tool call JSON ({"tool", "input"}) and
#                  logs the answer (this example runs no tool itself)
#   notify: JSON   sends the notification JSON ({"channel", "to", "subject", "body"})
#                  with `atasira notify` and logs whether it was accepted
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

# Hands the JSON $4 to `atasira $1` on stdin and logs "$2: JSON" when it exits 0, or "$3:"
# and the last line of its answer otherwise.
asking() {
    json=$(echo "$4" | sed 's/^ //')
    if answer=$(printf '%s' "$json" | atasira "$1" 2>&1); then
        echo "$2: $json" >&2
    else
        echo "$3: $(echo "$answer" | tail -n 1)" >&2
    fi
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
        tool:*) asking decide allowed refused "${line#tool:}" ;;
        notify:*) asking notify notified "not notified" "${line#notify:}" ;;
        sleep:*) sleep "$(echo "${line#sleep:}" | tr -d ' ')" ;;
        result:*) echo "${line#result:}" | sed 's/^ //' ;;
        fail:*) exit "$(echo "${line#fail:}" | tr -d ' ')" ;;
        done) exit 0 ;;
        *) echo "$line" ;;
    esac
done
exit 0
