package knowledge

// SetAfterCommit makes ix call f after each batch of an Add commits.
func SetAfterCommit(ix *Index, f func()) { ix.afterCommit = f }
