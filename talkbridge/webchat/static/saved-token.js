// On the "no access token" page of the plain address: a page that opened the full link before
// saved its token (localStorage); open the link with it, which sets the cookie again. Only from
// an address without a token, so a token that is refused is never retried in a loop.
try {
  const saved = localStorage.getItem("talkbridge.token");
  if (saved && !new URLSearchParams(location.search).has("token")) {
    location.replace(`/?token=${encodeURIComponent(saved)}`);
  }
} catch {
  /* storage blocked: the page says what to open */
}
