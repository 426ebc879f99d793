// A live feed over a websocket of the platform (/ws/jobs/<id>/, /ws/cluster/): connects with the
// session cookie, remembers the highest seq seen, reconnects with backoff asking for what came
// after it (?last_seq=N) and drops messages it has already handed on.
//
// Messages carry {"type", "seq", ...}. "job" messages (a job's current state; sent on connect and on
// every change) are always handed on; any other message with a seq is handed on once.

/**
 * Open a live feed: `const feed = live("/ws/jobs/7/", {onMessage, onStatus})`; `feed.close()` stops it.
 * onMessage(message): each new message, parsed. onStatus(status, detail): "connecting", "open",
 * "retrying" (detail: seconds until the next try) or "refused" (the server closed with a 4xxx code:
 * not signed in, not allowed; no retry).
 * Options: lastSeq (start after this seq, default 0: the server replays everything), minDelay and
 * maxDelay (backoff bounds, ms).
 */
export function live(path, { onMessage, onStatus = () => {}, lastSeq = 0, minDelay = 500, maxDelay = 15000 } = {}) {
  const seen = new Set();
  let highest = lastSeq;
  let delay = minDelay;
  let socket = null;
  let timer = null;
  let stopped = false;

  const url = () => {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${window.location.host}${path}?last_seq=${highest}`;
  };

  const handle = (raw) => {
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return; // not ours
    }
    if (!message || typeof message !== "object") return;
    const seq = message.seq;
    if (message.type !== "job" && typeof seq === "number") {
      if (seq <= lastSeq || seen.has(seq)) return;
      seen.add(seq);
      if (seq > highest) highest = seq;
    }
    delay = minDelay; // data flows: the next outage starts from the short delay again
    onMessage(message);
  };

  const connect = () => {
    timer = null;
    if (stopped) return;
    onStatus("connecting");
    socket = new WebSocket(url());
    socket.addEventListener("open", () => onStatus("open"));
    socket.addEventListener("message", (event) => handle(event.data));
    socket.addEventListener("close", (event) => {
      socket = null;
      if (stopped) return;
      if (event.code >= 4000 && event.code < 5000) {
        onStatus("refused", event.code);
        return;
      }
      onStatus("retrying", Math.round(delay / 1000));
      timer = setTimeout(connect, delay);
      delay = Math.min(maxDelay, delay * 2);
    });
  };

  connect();
  return {
    /** The highest seq handed on so far. */
    get lastSeq() {
      return highest;
    },
    /** Stop for good (no reconnect). */
    close() {
      stopped = true;
      if (timer) clearTimeout(timer);
      if (socket) socket.close(1000);
    },
  };
}

/** Show a feed's status in `node` (text and data-connected="true|false"). */
export function showStatus(node) {
  return (status, detail) => {
    if (!node) return;
    node.dataset.connected = String(status === "open");
    node.textContent = {
      connecting: "connecting…",
      open: "live",
      retrying: `disconnected; retrying in ${detail} s`,
      refused: "live updates refused (sign in again?)",
    }[status] || status;
  };
}
