"""paged: PagedAttention, layer by layer."""
