// A thread's seqs in ascending order, kept as the page learns them, so a new message finds its
// place (and its node's neighbour) by a binary search instead of sorting the thread again.
//
// Never `Math.min(...seqs)` or `f(...nodes)`: a spread passes each item as an argument, and a
// long thread's 130,000 of them overflow the call stack (RangeError) in Chromium.

/** The index of the first item of ascending `order` that is not below `seq`. */
export function lowerBound(order, seq) {
  let lo = 0;
  let hi = order.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (order[mid] < seq) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Put `fresh` (seqs not in ascending `order` yet, in any order) in their places, in place: a
 * push for the usual new message, a splice for one out of order, a merge for a page of history. */
export function insertSeqs(order, fresh) {
  const added = Array.from(fresh).sort((a, b) => a - b);
  if (!added.length) return;
  if (!order.length || added[0] > order[order.length - 1]) {
    for (const seq of added) order.push(seq);
    return;
  }
  if (added.length === 1) {
    order.splice(lowerBound(order, added[0]), 0, added[0]);
    return;
  }
  const old = order.slice();
  let i = 0;
  let j = 0;
  for (let k = 0; k < old.length + added.length; k += 1) {
    order[k] = j >= added.length || (i < old.length && old[i] < added[j]) ? old[i++] : added[j++];
  }
}

/** Make the children of `parent` that follow `after` (all of them, without it) exactly `nodes`,
 * moving only what is out of place: a node already where it belongs is left alone (a selection
 * in it, focus, its identity). */
export function placeChildren(parent, nodes, after = null) {
  let cursor = after ? after.nextSibling : parent.firstChild;
  for (const node of nodes) {
    if (node === cursor) cursor = cursor.nextSibling;
    else parent.insertBefore(node, cursor);
  }
  while (cursor) {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
  }
}
