// Server-sent events parsing for a fetch() body.
//
// EventSource cannot POST or send an Authorization header, so the chat stream is read with
// fetch + ReadableStream and parsed here. Follows the WHATWG "event stream interpretation"
// rules that matter for the daemon's stream: lines end in LF, CRLF or CR (a CRLF may be split
// across two network chunks), `:` lines are comments, a field without a colon has an empty
// value, one leading space after the colon is dropped, several `data:` lines of one event are
// joined with "\n", and an empty line dispatches the event. No DOM access: unit-tested in Node.

/** One dispatched event: `event` is the type ("message" unless an `event:` field said otherwise). */
export class SseEvent {
  /**
   * @param {string} event
   * @param {string} data
   * @param {string} id
   */
  constructor(event, data, id) {
    this.event = event;
    this.data = data;
    this.id = id;
  }
}

/** Incremental parser: feed decoded text in any chunking, get whole events back. */
export class SseParser {
  constructor() {
    this.buffer = '';
    this.pendingCr = false;
    this.resetEvent();
    this.lastId = '';
  }

  resetEvent() {
    this.dataLines = [];
    this.eventType = '';
  }

  /**
   * Feeds a chunk of text and returns the events it completed.
   * @param {string} text
   * @returns {SseEvent[]}
   */
  push(text) {
    const out = [];
    let s = text;
    // A CR at the end of the previous chunk already ended a line; a LF right after it is the
    // second half of a CRLF and must not end another (empty) line.
    if (this.pendingCr && s.startsWith('\n')) s = s.slice(1);
    this.pendingCr = false;
    this.buffer += s;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer[i];
      if (c !== '\n' && c !== '\r') continue;
      const line = this.buffer.slice(start, i);
      if (c === '\r') {
        if (i + 1 < this.buffer.length) {
          if (this.buffer[i + 1] === '\n') i++;
        } else {
          this.pendingCr = true;
        }
      }
      start = i + 1;
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  /**
   * Ends the stream: a final event without its blank line is discarded, as the spec says.
   * @returns {boolean} true when unterminated data was pending (a truncated stream).
   */
  finish() {
    const truncated = this.buffer.length > 0 || this.dataLines.length > 0;
    this.buffer = '';
    this.resetEvent();
    return truncated;
  }

  /** @param {string} line */
  line(line) {
    if (line === '') {
      if (this.dataLines.length === 0) {
        this.eventType = '';
        return null;
      }
      const ev = new SseEvent(this.eventType || 'message', this.dataLines.join('\n'), this.lastId);
      this.resetEvent();
      return ev;
    }
    if (line.startsWith(':')) return null;
    const colon = line.indexOf(':');
    let field = line;
    let value = '';
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
    }
    if (field === 'data') this.dataLines.push(value);
    else if (field === 'event') this.eventType = value;
    else if (field === 'id' && !value.includes('\0')) this.lastId = value;
    // `retry` and unknown fields are ignored: the UI never reconnects a chat stream.
    return null;
  }
}
