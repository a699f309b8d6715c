"""Network policy: a run's allowlist (`allowlist`), the listener made in its network
namespace (`listener`), the host-side proxy that serves it (`proxy`, `relay`) and the log of
what it did (`audit`)."""
